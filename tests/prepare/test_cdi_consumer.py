"""Every spec the plugin writes is accepted by the reference CDI library, and injecting the
CDI IDs it answers with yields the expected device nodes and environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.plugnode import Node, make_claim


def check(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, check=False,
                          timeout=60)


def test_specs_pass_the_reference_library_and_inject(node: Node, cdi_check_bin: Path) -> None:
    single = node.book.put(make_claim("single", ["gpu-2"]))
    multi = node.book.put(make_claim("multi", ["gpu-0", "gpu-1"], results=[
        {"request": "net/sub", "driver": "dra-agent.io", "pool": "node-a", "device": "nic-0"}]))
    out = node.prepare(single, multi)
    assert all(r.ok for r in out.values())

    report = check(cdi_check_bin, "validate", "-json", str(node.cdi_dir))
    assert report.returncode == 0, report.stdout + report.stderr

    ids = [i for d in out[multi["metadata"]["uid"]].devices for i in d.cdi_device_ids]
    injected = check(cdi_check_bin, "inject", str(node.cdi_dir), *ids)
    assert injected.returncode == 0, injected.stderr
    oci = json.loads(injected.stdout)
    env = oci["process"]["env"]
    uid = multi["metadata"]["uid"]
    assert f"DRA_AGENT_CLAIM_UID={uid}" in env
    assert "DRA_AGENT_CLAIM=default/multi" in env
    assert "DRA_AGENT_DEVICE_NIC_0_REQUEST=net" in env
    assert "DRA_AGENT_DEVICE_GPU_1_PCI_ADDRESS=0000:19:00.0" in env
    nodes = sorted((d["path"], d["major"], d["minor"]) for d in oci["linux"]["devices"])
    assert nodes == [("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1)]


def test_annotations_parse_as_a_runtime_parses_them(node: Node, cdi_check_bin: Path) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0", "gpu-4"]))
    node.prepare(claim)
    from agent.checkpoint.codec import decode

    rec = decode(node.checkpoint.read_bytes()).claims[claim["metadata"]["uid"]]
    ((key, value),) = rec.cdi_annotations.items()
    parsed = check(cdi_check_bin, "annotations", f"{key}={value}")
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr
    assert sorted(json.loads(parsed.stdout)["devices"]) == sorted(value.split(","))
