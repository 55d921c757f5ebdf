"""Group commit of the checkpoint (agent.checkpoint.groupcommit): changes that arrive while a
write is under way are applied in turn and written together, with one fsync, and each
caller still gets its own outcome."""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent.checkpoint.model import ClaimRecord, ClaimState
from agent.checkpoint.store import CheckpointStore, CheckpointWriteError
from cdi.atomicfile import OsFileOps
from tests.waiting import wait_for


class GatedOps(OsFileOps):
    """Real calls; counts fsyncs; the first fsync waits for ``gate`` (the write in progress
    that the others queue behind); ``fail`` makes every fsync fail with ENOSPC."""

    def __init__(self, gated: bool = True) -> None:
        self.fsyncs = 0
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.gated = gated
        self.fail = False

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.fail:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.gated:
            self.gated = False
            self.entered.set()
            assert self.gate.wait(30)
        super().fsync(fd)


def record(uid: str, name: str = "c") -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="default", name=name,
                       state=ClaimState.PREPARE_COMPLETED)


def put(rec: ClaimRecord):  # type: ignore[no-untyped-def]
    return lambda claims: claims.__setitem__(rec.uid, rec)


def run_batch(store: CheckpointStore, ops: GatedOps, changes: list) -> list:  # type: ignore[type-arg]
    """The first change's write held in its fsync while the others queue, then let go; each
    change's outcome (its result or the exception it raised)."""
    outcomes: list[object] = [None] * len(changes)

    def call(i: int) -> None:
        try:
            outcomes[i] = store.update(changes[i])
        except Exception as err:
            outcomes[i] = err

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert ops.entered.wait(30)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, len(changes))]
    for t in others:
        t.start()
    wait_for(lambda: store._commits.waiting() == len(others), what="the callers queued")
    ops.gate.set()
    for t in [first, *others]:
        t.join(30)
    return outcomes


def test_sixteen_concurrent_changes_are_written_with_two_fsyncs(tmp_path: Path) -> None:
    ops = GatedOps()
    store = CheckpointStore(tmp_path / "checkpoint.json", ops=ops, volatile=lambda _: False)
    run_batch(store, ops, [put(record(f"u{i}")) for i in range(16)])
    assert ops.fsyncs == 2  # the first change alone, then the 15 that queued behind it
    assert sorted(CheckpointStore(tmp_path / "checkpoint.json").claims()) == sorted(
        f"u{i}" for i in range(16))


def test_a_change_that_raises_in_a_batch_fails_alone(tmp_path: Path) -> None:
    ops = GatedOps()
    store = CheckpointStore(tmp_path / "checkpoint.json", ops=ops, volatile=lambda _: False)

    def refuse(claims: dict[str, ClaimRecord]) -> None:
        claims["bad"] = record("bad")
        raise ValueError("device taken")

    changes = [put(record(f"u{i}")) for i in range(4)]
    changes.insert(2, refuse)
    outcomes = run_batch(store, ops, changes)
    assert isinstance(outcomes[2], ValueError)
    assert [o for i, o in enumerate(outcomes) if i != 2] == [None] * 4
    assert sorted(CheckpointStore(tmp_path / "checkpoint.json").claims()) == [
        "u0", "u1", "u2", "u3"]


def test_a_record_that_cannot_be_encoded_fails_alone_in_a_batch(tmp_path: Path) -> None:
    ops = GatedOps()
    store = CheckpointStore(tmp_path / "checkpoint.json", ops=ops, volatile=lambda _: False)
    changes = [put(record("u0")), put(record("u1")), put(record("u2", name="bad\udcff")),
               put(record("u3"))]
    outcomes = run_batch(store, ops, changes)
    assert isinstance(outcomes[2], CheckpointWriteError)
    assert "cannot be encoded" in str(outcomes[2])
    assert sorted(CheckpointStore(tmp_path / "checkpoint.json").claims()) == [
        "u0", "u1", "u3"]


def test_a_failed_write_keeps_what_only_the_cache_had(tmp_path: Path) -> None:
    """A PrepareStarted record kept in the cache only reserves its devices; another claim's
    write failing on a full disk (the file unchanged) must not drop that reservation."""
    ops = GatedOps(gated=False)
    store = CheckpointStore(tmp_path / "checkpoint.json", ops=ops, volatile=lambda _: False)
    store.update(put(record("done")))
    started = replace(record("started"), state=ClaimState.PREPARE_STARTED)
    store.update(put(started), durable=False)
    ops.fail = True
    with pytest.raises(CheckpointWriteError, match="No space left"):
        store.update(put(record("other")))
    assert sorted(store.claims()) == ["done", "started"]
    ops.fail = False
    store.update(put(record("other")))
    assert sorted(CheckpointStore(tmp_path / "checkpoint.json").claims()) == [
        "done", "other", "started"]


def test_no_fsync_on_tmpfs_and_one_on_a_disk(tmp_path: Path) -> None:
    for volatile, fsyncs in ((True, 0), (False, 1)):
        ops = GatedOps(gated=False)
        store = CheckpointStore(tmp_path / f"{volatile}" / "checkpoint.json", ops=ops,
                                volatile=lambda _, v=volatile: v)  # type: ignore[misc]
        store.update(put(record("u0")))
        assert ops.fsyncs == fsyncs
        assert list(CheckpointStore(store.path).claims()) == ["u0"]
