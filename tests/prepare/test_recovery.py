"""Crash, restart and corruption: the checkpoint never loses a prepared device."""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import replace
from pathlib import Path

from agent.checkpoint.codec import decode, encode
from agent.checkpoint.model import CheckpointData, ClaimState
from agent.checkpoint.store import CheckpointStore
from agent.claim.model import ClaimRef
from tests.plugnode import DRIVER, Node, make_claim


def spec_path(node: Node, uid: str) -> Path:
    return node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"


def test_prepare_started_record_is_rolled_back_at_start(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    # Simulate a crash between "PrepareStarted" and "PrepareCompleted".
    data = decode(node.checkpoint.read_bytes())
    started = replace(data.claims[uid], state=ClaimState.PREPARE_STARTED)
    node.server.stop(0)
    node.checkpoint.write_bytes(encode(data.with_claims({uid: started})))
    node.restart()
    assert not spec_path(node, uid).exists()
    assert decode(node.checkpoint.read_bytes()).claims == {}
    assert node.prepare(claim)[uid].ok  # the kubelet retries; it works


def test_orphaned_spec_of_ours_is_removed_at_start_but_others_are_kept(node: Node) -> None:
    node.server.stop(0)
    node.cdi_dir.mkdir(exist_ok=True)
    orphan = spec_path(node, str(uuid.uuid4()))
    orphan.write_text('{"cdiVersion": "0.5.0", "kind": "k8s.dra-agent.io/claim", "devices": []}')
    foreign = node.cdi_dir / "nvidia.com-gpu.json"
    foreign.write_text("{}")
    node.restart()
    assert not orphan.exists() and foreign.exists()


def test_corrupt_checkpoint_start_keeps_copy_and_unprepare_still_works(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    node.server.stop(0)
    node.checkpoint.write_bytes(b'{"claims": {"trunc')  # torn write, disk error...
    node.restart()
    copies = list(node.checkpoint.parent.glob("checkpoint.json.corrupt-*"))
    assert len(copies) == 1 and copies[0].read_bytes().startswith(b'{"claims"')
    assert node.metrics.registry.get_sample_value("dra_agent_checkpoint_corrupt_total") == 1
    # The spec on disk was adopted: its device stays reserved...
    other = node.book.put(make_claim("other", ["gpu-0"]))
    assert "already prepared" in node.prepare(other)[other["metadata"]["uid"]].error
    # ...a repeated prepare of the claim itself works and answers as before...
    result = node.prepare(claim)[uid]
    assert result.ok and [d.device_name for d in result.devices] == ["gpu-0"]
    rec = decode(node.checkpoint.read_bytes()).claims[uid]
    assert not rec.recovered and rec.name == "c1"
    # ...and unprepare needs nothing but the UID.
    assert node.unprepare(claim)[uid].ok
    assert not spec_path(node, uid).exists()
    assert node.prepare(other)[other["metadata"]["uid"]].ok


def test_checkpoint_with_bad_checksum_salvages_records(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-1"]))
    uid = claim["metadata"]["uid"]
    node.prepare(claim)
    node.server.stop(0)
    doc = json.loads(node.checkpoint.read_bytes())
    doc["checksum"] = "sha256:0"
    node.checkpoint.write_text(json.dumps(doc))
    node.restart()
    rec = decode(node.checkpoint.read_bytes()).claims[uid]
    assert rec.recovered and rec.devices[0].device == "gpu-1"


def test_unprepare_with_unreadable_checkpoint_removes_the_spec(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    node.prepare(claim)
    node.checkpoint.write_bytes(b"\x00\x01")  # corrupted while running
    assert node.unprepare(claim)[uid].ok
    assert not spec_path(node, uid).exists()


def test_newer_checkpoint_is_read_and_its_fields_survive_a_prepare(node: Node) -> None:
    from agent.checkpoint.codec import checksum

    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    node.prepare(claim)
    node.server.stop(0)
    doc = json.loads(node.checkpoint.read_bytes())
    doc["schemaVersion"] = 2
    doc["claims"][uid]["futureField"] = {"a": 1}
    doc["checksum"] = checksum(doc)
    node.checkpoint.write_text(json.dumps(doc))
    node.restart()
    second = node.book.put(make_claim("c2", ["gpu-1"]))
    assert node.prepare(second)[second["metadata"]["uid"]].ok
    after = json.loads(node.checkpoint.read_bytes())
    assert after["schemaVersion"] == 2 and after["claims"][uid]["futureField"] == {"a": 1}
    assert node.prepare(claim)[uid].ok


def test_100_concurrent_prepares_and_unprepares_leave_an_exact_checkpoint(node: Node) -> None:
    node.inventory[:] = [replace(node.inventory[0], name=f"dev-{i}") for i in range(100)]
    claims = [node.book.put(make_claim(f"c{i}", [f"dev-{i}"])) for i in range(100)]
    keep = {c["metadata"]["uid"] for c in claims[::2]}
    errors: list[str] = []

    def cycle(claim: dict) -> None:
        uid = claim["metadata"]["uid"]
        for _ in range(2):
            if not node.prepare(claim)[uid].ok:
                errors.append(f"prepare {uid}")
            if uid not in keep and not node.unprepare(claim)[uid].ok:
                errors.append(f"unprepare {uid}")

    threads = [threading.Thread(target=cycle, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    records = decode(node.checkpoint.read_bytes()).claims
    assert set(records) == keep
    assert all(r.state is ClaimState.PREPARE_COMPLETED for r in records.values())
    assert {p.name.split("_")[1][:-5] for p in node.cdi_dir.glob("*.json")} == keep
    assert node.metrics.registry.get_sample_value("dra_agent_prepared_claims") == 50


def test_same_device_raced_by_many_claims_goes_to_exactly_one(node: Node) -> None:
    claims = [node.book.put(make_claim(f"r{i}", ["gpu-5"])) for i in range(12)]
    results: dict[str, bool] = {}

    def go(claim: dict) -> None:
        uid = claim["metadata"]["uid"]
        results[uid] = node.prepare(claim)[uid].ok

    threads = [threading.Thread(target=go, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == 1


def test_failed_spec_write_rolls_back_the_record(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    node.cdi_dir.write_text("not a directory")  # the CDI dir cannot be written
    err = node.prepare(claim)[uid].error
    assert "cannot write CDI spec" in err
    assert decode(node.checkpoint.read_bytes()).claims == {}


def test_store_written_by_two_instances_stays_consistent(tmp_path: Path) -> None:
    # rolling update: the store re-reads the file the other instance replaced
    a = CheckpointStore(tmp_path / "checkpoint.json")
    b = CheckpointStore(tmp_path / "checkpoint.json")
    a.update(lambda c: None)
    assert b.claims() == {} and a.claims() == {}
    assert CheckpointData() == decode(encode(CheckpointData()))
    assert ClaimRef("a", "b", "c").uid == "c"


def test_one_claim_shared_by_pods_prepared_concurrently_gives_one_answer(node: Node) -> None:
    claim = node.book.put(make_claim("shared", ["gpu-6", "gpu-7"]))
    uid = claim["metadata"]["uid"]
    answers: list[object] = []

    def pod_sync() -> None:
        answers.append(node.prepare(claim)[uid])

    threads = [threading.Thread(target=pod_sync) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8 and all(a == answers[0] for a in answers)
    assert answers[0].ok  # type: ignore[attr-defined]
    assert list(decode(node.checkpoint.read_bytes()).claims) == [uid]
    samples = node.metrics.registry.get_sample_value
    assert samples("dra_agent_requests_total",
                   {"method": "NodePrepareResources", "result": "ok"}) == 8
    assert samples("dra_agent_prepared_devices") == 2
    assert samples("dra_agent_requests_in_flight", {"method": "NodePrepareResources"}) == 0
