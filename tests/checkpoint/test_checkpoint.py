"""Checkpoint format and store: round trips, checksum, unknown fields, corruption, locking."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent.checkpoint.codec import (
    CheckpointCorruptError,
    RecordTexts,
    checksum,
    decode,
    encode,
)
from agent.checkpoint.model import CheckpointData, ClaimRecord, ClaimState, PreparedDevice
from agent.checkpoint.store import CheckpointStore, read_boot_id
from agent.common.metrics import Metrics


def record(uid: str, device: str = "gpu-0", state: ClaimState = ClaimState.PREPARE_COMPLETED):
    return ClaimRecord(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid[:4]}",
        state=state,
        devices=(PreparedDevice(pool="node-a", device=device, requests=("gpu",),
                                cdi_ids=(f"k8s.dra-agent.io/claim={uid}-{device}",)),),
        cdi_annotations={"cdi.k8s.io/dra-agent.io_" + uid: f"k8s.dra-agent.io/claim={uid}"},
        spec_path=f"/var/run/cdi/k8s.dra-agent.io-claim_{uid}.json",
        boot_id="boot-1",
        updated="2026-01-01T00:00:00Z",
    )


def test_round_trip_keeps_every_field() -> None:
    data = CheckpointData(claims={"u1": record("u1"), "u2": record("u2", "gpu-1")})
    assert decode(encode(data)) == data


def test_the_file_is_the_canonical_document_with_its_checksum() -> None:
    """What ``encode`` assembles from members is ``json.dumps(sort_keys=True)`` of the whole
    document, with and without reused record texts, ASCII or not."""
    claims = {"u2": record("u2", "gpu-1"), "u1": record("u1")}
    ascii_only = CheckpointData(claims=claims, extra={"zeta": [1], "alpha": {"b": 1, "a": "x"}})
    accented = CheckpointData(claims={**claims, "u3": replace(record("u3"), updated="é")},
                              extra={"alpha": {"a": "é"}})
    for data in (ascii_only, accented):
        raw = encode(data)
        doc = json.loads(raw)
        assert raw == (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()
        assert doc["checksum"] == checksum(doc)
        texts: RecordTexts = {}
        assert encode(data, texts) == raw
        assert encode(data, texts) == raw  # every record's text reused
        assert decode(raw) == data


def test_reused_texts_follow_the_records() -> None:
    """A record replaced is encoded again; one removed leaves the reused texts."""
    texts: RecordTexts = {}
    first = CheckpointData(claims={"u1": record("u1"), "u2": record("u2", "gpu-1")})
    encode(first, texts)
    assert set(texts) == {"u1", "u2"}
    second = first.with_claims({"u1": record("u1", "gpu-7")})
    raw = encode(second, texts)
    assert raw == encode(second)  # not the cached text of the old u1
    assert decode(raw).claims["u1"].devices[0].device == "gpu-7"
    assert set(texts) == {"u1"} and texts["u1"][0] is second.claims["u1"]


def test_checksum_mismatch_is_corrupt() -> None:
    raw = encode(CheckpointData(claims={"u1": record("u1")}))
    tampered = raw.replace(b"gpu-0", b"gpu-9")
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        decode(tampered)


def test_newer_version_with_added_fields_is_read_and_rewritten_without_loss() -> None:
    doc = json.loads(encode(CheckpointData(claims={"u1": record("u1")})))
    doc["schemaVersion"] = 7
    doc["futureTopLevel"] = {"x": 1}
    doc["claims"]["u1"]["futureField"] = [1, 2]
    doc["claims"]["u1"]["devices"][0]["futureDeviceField"] = "y"
    doc["checksum"] = checksum(doc)
    data = decode(json.dumps(doc).encode())
    assert data.schema_version == 7
    assert data.claims["u1"].devices[0].device == "gpu-0"
    rewritten = json.loads(encode(data))
    assert rewritten == doc


def test_unknown_state_is_corrupt() -> None:
    doc = json.loads(encode(CheckpointData(claims={"u1": record("u1")})))
    doc["claims"]["u1"]["state"] = "Bogus"
    doc["checksum"] = checksum(doc)
    with pytest.raises(CheckpointCorruptError, match="unknown state"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize(("where", "key"), [("device", "adminAccess"), ("claim", "recovered")])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, []])
def test_booleans_that_are_not_json_booleans_are_corrupt(where: str, key: str,
                                                          value: object) -> None:
    """``"false"`` must never read as True (admin access would let a record take a device
    another claim holds)."""
    doc = json.loads(encode(CheckpointData(claims={"u1": record("u1")})))
    target = doc["claims"]["u1"]["devices"][0] if where == "device" else doc["claims"]["u1"]
    target[key] = value
    doc["checksum"] = checksum(doc)
    with pytest.raises(CheckpointCorruptError, match=f"{key} must be true or false"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"\xff\xfe", b'{"claims": {}}'])
def test_garbage_is_corrupt(raw: bytes) -> None:
    with pytest.raises(CheckpointCorruptError):
        decode(raw)


def test_store_update_writes_durably_and_reads_back(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.update(lambda c: c.__setitem__("u1", record("u1")))
    assert (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600
    fresh = CheckpointStore(tmp_path / "checkpoint.json")
    assert fresh.claims() == {"u1": record("u1")}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_durable_update_writes_what_an_earlier_non_durable_one_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    started = record("u1", state=ClaimState.PREPARE_STARTED)
    store.update(lambda c: c.__setitem__("u1", started), durable=False)
    assert not (tmp_path / "checkpoint.json").exists() and store.claims() == {"u1": started}
    # The same record again, durably (a prepare about to change the host): no change to the
    # records, but the file must get them.
    store.update(lambda c: c.__setitem__("u1", started))
    assert CheckpointStore(tmp_path / "checkpoint.json").claims() == {"u1": started}
    mtime = (tmp_path / "checkpoint.json").stat().st_mtime_ns
    store.update(lambda c: c.__setitem__("u1", started))  # now nothing is pending: no write
    assert (tmp_path / "checkpoint.json").stat().st_mtime_ns == mtime


def test_store_sees_writes_of_another_instance(tmp_path: Path) -> None:
    a = CheckpointStore(tmp_path / "checkpoint.json")
    b = CheckpointStore(tmp_path / "checkpoint.json")
    a.update(lambda c: c.__setitem__("u1", record("u1")))
    b.update(lambda c: c.__setitem__("u2", record("u2")))
    assert set(a.claims()) == {"u1", "u2"}


def test_failed_change_writes_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")

    def boom(claims: dict[str, ClaimRecord]) -> None:
        claims["u1"] = record("u1")
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        store.update(boom)
    assert not (tmp_path / "checkpoint.json").exists()


def test_corrupt_file_is_set_aside_counted_and_records_salvaged(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    raw = encode(CheckpointData(claims={"u1": record("u1")}))
    assert b'"checksum":"sha256:' in raw
    path.write_bytes(raw.replace(b'"checksum":"sha256:', b'"checksum":"sha256:00'))
    metrics = Metrics()
    store = CheckpointStore(path, metrics=metrics, clock=lambda: 1234.0)
    claims = store.claims()
    assert claims["u1"].recovered and claims["u1"].devices[0].device == "gpu-0"
    assert (tmp_path / "checkpoint.json.corrupt-1234").read_bytes().startswith(b"{")
    assert metrics.registry.get_sample_value("dra_agent_checkpoint_corrupt_total") == 1.0
    # the salvaged state was persisted as a valid checkpoint
    assert decode(path.read_bytes()).claims["u1"].recovered


def test_unparsable_file_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b"\x00garbage")
    store = CheckpointStore(path, clock=lambda: 5.0)
    assert store.claims() == {}
    assert store.corrupt_copies == [tmp_path / "checkpoint.json.corrupt-5"]
    store.update(lambda c: c.__setitem__("u1", record("u1")))
    assert set(CheckpointStore(path).claims()) == {"u1"}


def test_concurrent_updates_from_threads_and_instances_lose_nothing(tmp_path: Path) -> None:
    stores = [CheckpointStore(tmp_path / "checkpoint.json") for _ in range(2)]

    def work(i: int) -> None:
        stores[i % 2].update(lambda c: c.__setitem__(f"u{i}", record(f"u{i}")))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(CheckpointStore(tmp_path / "checkpoint.json").claims()) == {
        f"u{i}" for i in range(40)
    }


def test_boot_id_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_boot_id(tmp_path / "nope") == ""
    (tmp_path / "boot_id").write_text("abc\n")
    assert read_boot_id(tmp_path / "boot_id") == "abc"
