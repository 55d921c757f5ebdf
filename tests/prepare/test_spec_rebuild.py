"""Item 4 of #15: CDI specs of completed claims are rebuilt at start-up, before registration,
from the checkpoint and the current inventory; a device gone is reported, never fatal."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from agent.checkpoint.codec import decode, encode
from tests.plugnode import DRIVER, Node, gpu, make_claim


def spec_path(node: Node, uid: str) -> Path:
    return node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"


def _minors(path: Path) -> list[int]:
    spec = json.loads(path.read_text())
    return [n["minor"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def _reboot(node: Node, boot_id: str = "boot-2") -> None:
    """tmpfs gone, a new boot ID; the agent starts again but nothing calls prepare."""
    node.server.stop(0)
    for f in node.cdi_dir.iterdir():
        f.unlink()
    (node.root / "boot_id").write_text(boot_id + "\n")


def test_reboot_rebuilds_every_spec_with_current_minors_before_registering(node: Node) -> None:
    a = node.book.put(make_claim("a", ["gpu-1"]))
    b = node.book.put(make_claim("b", ["gpu-2", "gpu-3"]))
    uid_a, uid_b = a["metadata"]["uid"], b["metadata"]["uid"]
    assert all(r.ok for r in node.prepare(a, b).values())
    assert _minors(spec_path(node, uid_a)) == [1]
    _reboot(node)
    # After the reboot gpu-1's device node has another minor.
    node.inventory[1] = replace(gpu(1), host=replace(gpu(1).host, minor=7))
    node.book.claims.clear()  # the API server is unreachable: only the checkpoint is used
    server = node.new_server()
    server.start()
    node.server = server
    # start() returns after recovery; the specs are there before the kubelet can register.
    assert _minors(spec_path(node, uid_a)) == [7]
    assert _minors(spec_path(node, uid_b)) == [2, 3]
    records = decode(node.checkpoint.read_bytes()).claims
    assert {r.boot_id for r in records.values()} == {"boot-2"}
    assert node.metrics.registry.get_sample_value("dra_agent_cdi_specs_rebuilt_total") == 2


def test_one_lost_spec_is_rewritten_and_the_rest_left_alone(node: Node) -> None:
    a = node.book.put(make_claim("a", ["gpu-0"]))
    b = node.book.put(make_claim("b", ["gpu-1"]))
    uid_a, uid_b = a["metadata"]["uid"], b["metadata"]["uid"]
    assert all(r.ok for r in node.prepare(a, b).values())
    node.server.stop(0)
    spec_path(node, uid_a).unlink()
    before_b = spec_path(node, uid_b).stat().st_mtime_ns
    node.restart()
    assert _minors(spec_path(node, uid_a)) == [0]
    assert spec_path(node, uid_b).stat().st_mtime_ns == before_b


def test_a_vanished_device_is_reported_once_and_start_up_goes_on(node: Node) -> None:
    gone = node.book.put(make_claim("gone", ["gpu-5"]))
    kept = node.book.put(make_claim("kept", ["gpu-6"]))
    uid_gone, uid_kept = gone["metadata"]["uid"], kept["metadata"]["uid"]
    assert all(r.ok for r in node.prepare(gone, kept).values())
    _reboot(node)
    node.inventory = [d for d in node.inventory if d.name != "gpu-5"]
    since = len(node.kubelet.registrations)  # the stopped instance's registration is not it
    node.server = node.new_server()
    node.server.start()  # does not raise
    node.kubelet.wait_registered(DRIVER, timeout=30, since=since)
    assert not spec_path(node, uid_gone).exists()
    assert spec_path(node, uid_kept).exists()
    errors = node.metrics.registry.get_sample_value(
        "dra_agent_cdi_spec_rebuild_errors_total", {"reason": "unknown_device"})
    assert errors == 1
    # The kubelet's next prepare gets the reason as a per-claim error, not a stale CDI ID.
    result = node.prepare(gone)[uid_gone]
    assert not result.ok and "gpu-5" in result.error and "does not exist" in result.error
    assert node.prepare(kept)[uid_kept].ok


def test_records_without_allocation_are_reported_not_fatal(node: Node) -> None:
    claim = node.book.put(make_claim("old", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    data = decode(node.checkpoint.read_bytes())
    _reboot(node)
    node.checkpoint.write_bytes(encode(data.with_claims(
        {uid: replace(data.claims[uid], allocation=None)})))
    since = len(node.kubelet.registrations)  # the stopped instance's registration is not it
    node.server = node.new_server()
    node.server.start()
    assert node.metrics.registry.get_sample_value(
        "dra_agent_cdi_spec_rebuild_errors_total", {"reason": "no_allocation"}) == 1
    node.kubelet.wait_registered(DRIVER, timeout=30, since=since)
    assert node.prepare(claim)[uid].ok  # the API object still rebuilds it on prepare
    assert spec_path(node, uid).exists()
