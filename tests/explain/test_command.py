"""``dra-agent explain`` end to end: files, simulated discovery, exit codes, output formats."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.common.config import Config
from agent.explain import explain
from agent.explain.sources import slices_from_discovery
from tests.explain.builders import CLASSES, DRIVER, allocated, claim, dgx_slice, exactly

PCIE = "resource.kubernetes.io/pcieRoot"


@pytest.fixture(scope="module")
def h100_slices():
    return slices_from_discovery(Config(simulate="dgx-h100", node_name="sim-h100"))


@pytest.fixture(scope="module")
def a100_slices():
    return slices_from_discovery(Config(simulate="dgx-a100-mig", node_name="sim-a100"))


def write(tmp_path: Path, name: str, *objs) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump_all(list(objs), sort_keys=False))
    return str(p)


def invoke(*args):
    return CliRunner().invoke(main, ["explain", *args], catch_exceptions=False)


def test_simulated_h100_pairs_gpus_with_nics_under_one_root(h100_slices):
    c = claim(exactly("gpu"), exactly("nic", "nic.dra-agent.io"),
              constraints=[{"matchAttribute": PCIE}])
    r = explain(c, CLASSES, h100_slices, "sim-h100")
    assert r.fits
    devices = {x["request"]: x["device"] for x in r.allocation["devices"]["results"]}
    roots = {v.device: v.where for rep in r.requests for v in rep.devices}
    assert roots[devices["gpu"]] == roots[devices["nic"]]


def test_simulated_h100_eight_gpus_all_mode_and_the_ninth_does_not_fit(h100_slices):
    r = explain(claim(exactly("gpu", allocationMode="All")), CLASSES, h100_slices, "sim-h100")
    assert r.fits and len(r.allocation["devices"]["results"]) == 8
    r = explain(claim(exactly("gpu", count=9)), CLASSES, h100_slices, "sim-h100")
    assert not r.fits and "only 8 match" in r.suggestion


def test_simulated_a100_mig_by_memory(a100_slices):
    # A "40gb" MIG slice has 40192Mi, a little under 40Gi.
    sel = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("39Gi")) >= 0'
    r = explain(claim(exactly("m", "mig.dra-agent.io", 2, sel)), CLASSES, a100_slices,
                "sim-a100")
    assert r.fits
    chosen = [x["device"] for x in r.allocation["devices"]["results"]]
    assert all("40gb" in d for d in chosen)
    busy = [allocated("other", *chosen, pool="sim-a100")]
    r = explain(claim(exactly("m", "mig.dra-agent.io", 6, sel)), CLASSES, a100_slices,
                "sim-a100", busy)
    assert not r.fits


def test_command_fits_exit_0_with_json_allocation(tmp_path):
    c = write(tmp_path, "claim.yaml", claim(exactly("gpu", count=2)))
    k = write(tmp_path, "classes.yaml", *CLASSES)
    s = write(tmp_path, "slices.yaml", dgx_slice())
    out = invoke("-f", c, "--class", k, "--slices", s, "--node-name", "node-a", "-o", "json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["fits"] is True
    assert [x["device"] for x in data["allocation"]["devices"]["results"]] == ["gpu-0", "gpu-1"]


def test_command_does_not_fit_exit_1_with_a_suggestion(tmp_path):
    c = write(tmp_path, "claim.yaml", claim(exactly("gpu", count=4)))
    k = write(tmp_path, "classes.yaml", *CLASSES)
    s = write(tmp_path, "slices.yaml", dgx_slice())
    a = write(tmp_path, "held.yaml", allocated("train-0", "gpu-2"))
    out = invoke("-f", c, "--class", k, "--slices", s, "--allocated", a, "--node-name", "node-a")
    assert out.exit_code == 1
    assert "DOES NOT FIT" in out.output
    assert "gpu-2 under pci0000:a0, is not: allocated to claim default/train-0" in out.output
    out = invoke("-f", c, "--class", k, "--slices", s, "--allocated", a, "--node-name", "node-a",
                 "-o", "yaml")
    assert out.exit_code == 1 and yaml.safe_load(out.output)["fits"] is False


def test_command_bad_input_exit_2_with_file_and_line(tmp_path):
    k = write(tmp_path, "classes.yaml", *CLASSES)
    s = write(tmp_path, "slices.yaml", dgx_slice())
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ResourceClaim\nspec:\n  devices:\n    requests:\n    - name: [\n")
    out = invoke("-f", str(bad), "--class", k, "--slices", s)
    assert out.exit_code == 2 and f"{bad}:" in out.output
    cel = write(tmp_path, "cel.yaml", claim(exactly("gpu", "gpu.dra-agent.io", 1,
                                                    "device.attributes[")))
    out = invoke("-f", cel, "--class", k, "--slices", s)
    assert out.exit_code == 2
    assert f"{cel}:" in out.output and "request gpu selector #0 does not compile" in out.output
    missing = write(tmp_path, "m.yaml", claim(exactly("gpu", "nope.dra-agent.io")))
    out = invoke("-f", missing, "--class", k, "--slices", s)
    assert out.exit_code == 2 and "DeviceClass 'nope.dra-agent.io' not found" in out.output


def test_command_from_discovery_with_simulate(tmp_path):
    c = write(tmp_path, "claim.yaml", claim(exactly("gpu", count=8)))
    k = write(tmp_path, "classes.yaml", *CLASSES)
    out = invoke("-f", c, "--class", k, "--slices", "from-discovery", "--simulate", "dgx-h100",
                 "--node-name", "sim")
    assert out.exit_code == 0, out.output
    assert "FITS" in out.output


NUMA = "resource.kubernetes.io/numaNode"
LISTS = {"DRAListTypeAttributes": True}


@pytest.mark.parametrize("lists", [False, True])
def test_numa_match_on_the_simulated_h100_in_either_form(lists):
    # SNC-2: GPUs 0-3 sit on node 0 ([0, 2]), 4-7 on node 1 ([1, 3]); both forms agree that
    # four GPUs share a NUMA neighbourhood and five do not.
    cfg = Config(simulate="dgx-h100", node_name="sim-h100")
    slices = slices_from_discovery(cfg, lists)
    values = {str(d["attributes"][NUMA]) for s in slices for d in s["spec"]["devices"]
              if d["name"].startswith("gpu-")}
    assert values == ({"{'ints': [0, 2]}", "{'ints': [1, 3]}"} if lists
                      else {"{'int': 0}", "{'int': 1}"})
    gates = LISTS if lists else None
    for count, fits in ((4, True), (5, False)):
        c = claim(exactly("gpu", count=count), constraints=[{"matchAttribute": NUMA}])
        assert explain(c, CLASSES, slices, "sim-h100", feature_gates=gates).fits is fits


def test_command_from_discovery_follows_the_list_gate(tmp_path, monkeypatch):
    import agent.explain.sources as sources

    asked = []
    real = sources.slices_from_discovery

    def spy(cfg, list_attributes=False):
        asked.append(list_attributes)
        return real(cfg, list_attributes)

    monkeypatch.setattr(sources, "slices_from_discovery", spy)
    c = write(tmp_path, "claim.yaml", claim(exactly("gpu", count=4),
                                            constraints=[{"matchAttribute": NUMA}]))
    k = write(tmp_path, "classes.yaml", *CLASSES)
    base = ("-f", c, "--class", k, "--slices", "from-discovery", "--simulate", "dgx-h100",
            "--node-name", "sim")
    gate = ("--feature-gates", "DRAListTypeAttributes=true")
    for extra in ((), gate, ("--numa-node-attribute", "scalar", *gate),
                  ("--numa-node-attribute", "list", *gate)):
        out = invoke(*base, *extra)
        assert out.exit_code == 0 and "FITS" in out.output, out.output
    # auto follows the cluster's gate, as this node's agent would publish.
    assert asked == [False, True, False, True]
