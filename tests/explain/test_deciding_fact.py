"""When a constraint decides, explain says which fact decides ("no pcieRoot has 2 free GPUs"),
and the devices it stops share one line instead of one line each. On ``dgx_slice``: 4 GPUs
and 4 NICs, a GPU and a NIC under each of 4 PCIe roots, NUMA nodes 0, 0, 1, 1
(dra-agent.io/numa)."""

from __future__ import annotations

from agent.explain import explain
from agent.explain.render import to_table
from tests.explain.builders import CLASSES, NODE, allocated, claim, dgx_slice, exactly

ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "dra-agent.io/numa"  # builders.device(numa=...): unqualified, so the driver's domain


def _match(attr: str, *requests: str) -> dict[str, object]:
    return {"matchAttribute": attr, "requests": list(requests)}


def _distinct(attr: str, *requests: str) -> dict[str, object]:
    return {"distinctAttribute": attr, "requests": list(requests)}


def test_one_request_whose_devices_must_share_a_root() -> None:
    c = claim(exactly("gpus", count=2), constraints=[_match(ROOT, "gpus")])
    result = explain(c, CLASSES, [dgx_slice()], NODE)
    assert not result.fits
    assert result.suggestion == (f"constraint matchAttribute {ROOT}: no pcieRoot has 2 free "
                                 "devices for request gpus; the most any has is 1 (pci0000:15)")
    # The three GPUs it stops: one line, each with its own root beside its name.
    table = to_table(result)
    (line,) = [ln for ln in table.splitlines() if "matchAttribute" in ln and " x " in ln]
    assert line.split(" x ")[0].strip() == "3"
    assert "not pci0000:15, the value of gpu-0 chosen for request gpus" in line
    assert "gpu-1 (pci0000:40)" in line


def test_two_requests_that_must_share_a_numa_node_say_where_it_comes_closest() -> None:
    c = claim(exactly("gpus", count=2), exactly("nics", "nic.dra-agent.io", count=3),
              constraints=[_match(NUMA, "gpus", "nics")])
    result = explain(c, CLASSES, [dgx_slice()], NODE)
    assert not result.fits
    assert result.suggestion == (f"constraint matchAttribute {NUMA}: no numa has free "
                                 "devices for all of gpus, nics; closest is 0, where nics has 2 "
                                 "of 3")


def test_distinct_values_fewer_than_devices_needed() -> None:
    c = claim(exactly("gpus", count=3), constraints=[_distinct(NUMA, "gpus")])
    result = explain(c, CLASSES, [dgx_slice()], NODE)
    assert not result.fits
    assert result.suggestion == (f"constraint distinctAttribute {NUMA}: request(s) gpus need 3 "
                                 "devices with different numa values, but their free devices "
                                 "have only 2 (0, 1)")


def test_devices_held_by_other_claims_do_not_count_as_free() -> None:
    c = claim(exactly("gpus", count=2), exactly("nics", "nic.dra-agent.io", count=2),
              constraints=[_match(NUMA, "gpus", "nics")])
    assert explain(c, CLASSES, [dgx_slice()], NODE, [allocated("other", "gpu-0")]).fits
    # One GPU of each NUMA node held: two free GPUs, but on different nodes.
    held = allocated("other", "gpu-0", "gpu-2")
    c = claim(exactly("gpus", count=2), constraints=[_match(NUMA, "gpus")])
    result = explain(c, CLASSES, [dgx_slice()], NODE, [held])
    assert result.suggestion == (f"constraint matchAttribute {NUMA}: no numa has 2 free devices "
                                 "for request gpus; the most any has is 1 (0)")
