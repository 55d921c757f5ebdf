"""A checkpoint record the agent cannot read keeps every device it names taken (#28, finding
2): the file is still set aside as corrupt, but the record is kept as *unreadable*, holding
its devices, until the kubelet unprepares that claim or an operator forgets it
(``dra-agent claims --forget UID``). Never a double allocation, whatever field is malformed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from agent.checkpoint.codec import checksum, salvage
from agent.checkpoint.store import CheckpointStore
from agent.cli import main
from tests.checkpoint.test_hostile_files import in_thread
from tests.plugnode import NODE, Node, make_claim

Edit = Callable[[dict[str, Any]], None]


def _device(rec: dict[str, Any]) -> dict[str, Any]:
    device: dict[str, Any] = rec["devices"][0]
    return device


#: A malformed field of a prepared claim's record, by name: each makes the record one the
#: agent refuses to read, and each must leave its device taken.
MALFORMED: dict[str, Edit] = {
    "adminAccess-string": lambda r: _device(r).__setitem__("adminAccess", "false"),
    "unknown-state": lambda r: r.__setitem__("state", "Bogus"),
    "bad-namespace": lambda r: r.__setitem__("namespace", "../../etc"),
    "requests-not-a-list": lambda r: _device(r).__setitem__("requests", "req"),
    "timeSlice-list": lambda r: _device(r).__setitem__("timeSlice", []),
    "consumed-garbage": lambda r: _device(r).__setitem__("consumedCapacity", {"x": "lots"}),
    "metadata-path": lambda r: r.__setitem__("deviceMetadata", {"requests": ["../x"]}),
    "devices-an-object": lambda r: r.__setitem__("devices", {"0": _device(r)}),
    "device-a-string": lambda r: r.__setitem__("devices", [_device(r), "gpu-7"]),
}


def edit_record(node: Node, uid: str, edit: Edit, *, valid_checksum: bool = True) -> None:
    """``edit`` the record of ``uid``, then reboot the node: the CDI specs (tmpfs) are gone,
    so the checkpoint is all that says which devices are taken."""
    doc = json.loads(node.checkpoint.read_bytes())
    edit(doc["claims"][uid])
    doc["checksum"] = checksum(doc) if valid_checksum else "sha256:0"
    node.checkpoint.write_text(json.dumps(doc))
    for spec in node.cdi_dir.glob("*.json"):
        spec.unlink()
    node.prepare_options.boot_id_path.write_text("boot-2\n")


def prepared_on_gpu0(node: Node) -> tuple[dict[str, Any], str]:
    claim = node.book.put(make_claim("owner", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    return claim, uid


def other_claim_on_gpu0(node: Node) -> str:
    """The error of another claim's prepare of gpu-0 ("" when it was prepared)."""
    other = node.book.put(make_claim("thief", ["gpu-0"]))
    return str(node.prepare(other)[other["metadata"]["uid"]].error)


@pytest.mark.parametrize("valid_checksum", [True, False], ids=["checksum-ok", "checksum-bad"])
@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_record_that_cannot_be_read_keeps_its_device_taken(
        node: Node, kind: str, valid_checksum: bool) -> None:
    _, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED[kind], valid_checksum=valid_checksum)
    in_thread(node.restart)
    error = other_claim_on_gpu0(node)
    assert "gpu-0" in error and uid in error, error
    assert "cannot be read" in error, error
    assert "\n" not in error
    # The rest of the node serves as before.
    fresh = node.book.put(make_claim("fresh", ["gpu-1"]))
    assert node.prepare(fresh)[fresh["metadata"]["uid"]].ok


def test_a_device_named_only_by_an_unreadable_record_stays_taken(node: Node) -> None:
    _, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED["device-a-string"])  # gpu-7: in no device entry
    in_thread(node.restart)
    other = node.book.put(make_claim("other", ["gpu-2"]))
    assert node.prepare(other)[other["metadata"]["uid"]].ok  # named nowhere: free
    assert "gpu-0" in other_claim_on_gpu0(node)


def test_the_kubelets_unprepare_of_the_claim_frees_its_devices(node: Node) -> None:
    claim, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED["adminAccess-string"])
    in_thread(node.restart)
    assert node.unprepare(claim)[uid].ok
    assert other_claim_on_gpu0(node) == ""


def test_the_kubelets_next_prepare_of_the_claim_takes_it_over(node: Node) -> None:
    claim, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED["unknown-state"])
    in_thread(node.restart)
    assert node.prepare(claim)[uid].ok  # the claim itself: the record is replaced
    record = CheckpointStore(node.checkpoint).claims()[uid]
    assert record.unreadable is None and not record.recovered and record.completed


def test_one_log_line_names_the_claim_its_devices_and_why(
        node: Node, caplog: pytest.LogCaptureFixture) -> None:
    _, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED["adminAccess-string"])
    with caplog.at_level(logging.WARNING):
        in_thread(node.restart)
    lines = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    line = lines[0]
    assert getattr(line, "claim", None) == uid
    assert getattr(line, "devices", None) == f"{NODE}/gpu-0"
    assert "adminAccess" in str(getattr(line, "reason", ""))
    assert "--forget" in line.getMessage()


def test_an_unreadable_uid_is_kept_under_a_name_the_checkpoint_can_hold() -> None:
    doc = {"schemaVersion": 1, "claims": {
        "a\x00b": {"uid": "a\x00b", "namespace": "default", "name": "c",
                   "state": "PrepareCompleted",
                   "devices": [{"pool": "node-a", "device": "gpu-3", "requests": []}]},
        "x": {"devices": [{"pool": "node-a", "device": "gpu-4"},
                          {"pool": "../..", "device": "gpu-5"},  # no pool name
                          {"pool": "node-a", "device": "GPU 6"}]},  # no device name
    }}
    kept = salvage(json.dumps(doc).encode())
    held = {(d.pool, d.device): r.uid for r in kept.values() for d in r.devices}
    assert set(held) == {("node-a", "gpu-3"), ("node-a", "gpu-4")}
    assert held[("node-a", "gpu-4")] == "x"
    assert held[("node-a", "gpu-3")].startswith("unreadable-")
    for record in kept.values():
        assert record.recovered and record.unreadable
        assert not any(d.extra for d in record.devices)  # no effect has anything to act on
        json.dumps(record.to_json(), ensure_ascii=False).encode()  # writable


def test_claims_shows_the_unreadable_record_and_forget_clears_it(node: Node) -> None:
    _, uid = prepared_on_gpu0(node)
    node.server.stop(0)
    edit_record(node, uid, MALFORMED["adminAccess-string"])
    in_thread(node.restart)

    def claims(*args: str) -> tuple[int, str]:
        out = CliRunner().invoke(main, ["claims", "--kubelet-dir",
                                        str(node.options.kubelet_dir), *args])
        return out.exit_code, out.output

    code, out = claims()
    assert code == 0 and "Unreadable" in out and uid in out and "gpu-0" in out, out
    code, out = claims("-o", "wide")
    assert code == 0 and "adminAccess" in out, out
    code, out = claims("--forget", "no-such-uid")
    assert code == 1 and "no record" in out, out
    assert "gpu-0" in other_claim_on_gpu0(node)
    code, out = claims("--forget", uid)
    assert code == 0 and "forgot" in out, out
    assert uid not in CheckpointStore(node.checkpoint).claims()
    assert other_claim_on_gpu0(node) == ""


def test_forget_refuses_a_record_the_agent_can_read(node: Node) -> None:
    _, uid = prepared_on_gpu0(node)
    out = CliRunner().invoke(main, ["claims", "--kubelet-dir", str(node.options.kubelet_dir),
                                    "--forget", uid])
    assert out.exit_code == 1 and "unprepares it" in out.output, out.output
    assert uid in CheckpointStore(node.checkpoint).claims()
