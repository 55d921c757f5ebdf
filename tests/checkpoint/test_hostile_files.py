"""Hostile input that used to stop the agent or other claims: unencodable strings in a claim,
and anything planted under our names in the plugin and CDI directories.

Every start-up here runs in a thread joined with a generous timeout: a FIFO used to hang the
open for ever, and the assertion is that the thread ended, not how fast.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import click.testing
import pytest

import agent.daemon
import agent.daemon.early
from agent.checkpoint.codec import checksum, encode
from agent.checkpoint.model import CheckpointData, ClaimRecord, ClaimState, PreparedDevice
from agent.checkpoint.store import (
    MAX_CHECKPOINT_BYTES,
    CheckpointStore,
    CheckpointWriteError,
    read_boot_id,
)
from agent.claim.model import ClaimError, ClaimRef
from agent.claim.parse import parse_claim
from agent.prepare.cdispecs import MAX_SPEC_BYTES, CDIClaimSpecs, EnvOnlyEdits
from tests.plugnode import DRIVER, Node, make_claim

HANG_GUARD_S = 60.0


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread; fail if it never returns (a hang), re-raise what it raised."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test thread
            out["error"] = err

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "hung"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def record(uid: str, device: str = "gpu-0", **changes: Any) -> ClaimRecord:
    rec = ClaimRecord(
        uid=uid, namespace="ns", name=f"claim-{uid[:8].lower()}",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(PreparedDevice(pool="node-a", device=device, requests=("gpu",)),),
        boot_id="boot-1", updated="2026-01-01T00:00:00Z",
    )
    return replace(rec, **changes)


def surrogate() -> str:
    """What ``json.loads`` makes of a ``\\ud800`` escape: a lone surrogate."""
    value: str = json.loads('"x\\ud800"')
    return value


# -- 1. unencodable strings in a claim ------------------------------------------------------


@pytest.mark.parametrize(("where", "field"), [
    ("config", "status.allocation.devices.config[0].opaque.parameters.env.NCCL_DEBUG"),
    ("device", "status.allocation.devices.results[0].device"),
    ("key", "status.allocation.devices.config[0].opaque.parameters.'\\ud800'"),
    ("name", "metadata.name"),
])
def test_claim_with_a_lone_surrogate_is_refused_naming_the_field(where: str, field: str) -> None:
    params: dict[str, Any] = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
                              "env": {"NCCL_DEBUG": "INFO"}}
    claim = make_claim("c1", ["gpu-0"], uid="u-1", config=[
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}])
    if where == "config":
        params["env"]["NCCL_DEBUG"] = surrogate()
    elif where == "device":
        claim["status"]["allocation"]["devices"]["results"][0]["device"] = surrogate()
    elif where == "key":
        params["\ud800"] = 1
    else:
        claim["metadata"]["name"] = surrogate()
    expected = None if where == "name" else ClaimRef("default", "c1", "u-1")
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim, expected)
    message = str(caught.value)
    assert field in message and "not valid Unicode" in message
    message.encode()  # the error itself can be logged and sent to the kubelet


def test_surrogate_claim_fails_alone_and_the_other_claim_is_prepared(node: Node) -> None:
    bad = node.book.put(make_claim("bad", ["gpu-0"], config=[{"source": "FromClaim", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "env": {"A": surrogate()}}}}]))
    good = node.book.put(make_claim("good", ["gpu-1"]))
    answers = node.prepare(bad, good)
    assert "env.A holds a string that is not valid Unicode" in answers[bad["metadata"]["uid"]].error
    assert answers[good["metadata"]["uid"]].ok
    on_disk = CheckpointStore(node.checkpoint).claims()
    assert set(on_disk) == {good["metadata"]["uid"]} and on_disk[good["metadata"]["uid"]].completed


def test_opaque_parameters_nested_too_deep_for_the_checkpoint_fail_alone(node: Node) -> None:
    # 10 KiB of opaque parameters may nest thousands deep (the API server allows it); the
    # checkpoint's JSON encoder recurses and would fail the durable write after parsing.
    deep: Any = 0
    for _ in range(2_000):
        deep = [deep]
    bad = node.book.put(make_claim("deep", ["gpu-0"], config=[{"source": "FromClaim", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "x": deep}}}]))
    good = node.book.put(make_claim("good", ["gpu-1"]))
    answers = node.prepare(bad, good)
    error = answers[bad["metadata"]["uid"]].error
    assert "nests deeper than 64 levels" in error and len(error) < 400
    assert answers[good["metadata"]["uid"]].ok
    assert set(CheckpointStore(node.checkpoint).claims()) == {good["metadata"]["uid"]}


# -- the checkpoint cache never keeps a state that does not encode --------------------------


def test_poisoned_record_among_120_concurrent_prepares_fails_alone(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    uids = [f"claim-{i:03d}" for i in range(120)]
    poisoned = uids[37]
    barrier = threading.Barrier(len(uids))
    failed: dict[str, Exception] = {}

    def prepare(uid: str) -> None:
        alloc = {"config": [{"opaque": {"parameters": {"v": surrogate() if uid == poisoned
                                                       else "ok"}}}]}
        started = record(uid, device=f"gpu-{uid}", state=ClaimState.PREPARE_STARTED,
                         allocation=alloc)
        barrier.wait()
        try:  # as DevicePreparer.prepare: PrepareStarted cached only, PrepareCompleted durable
            store.update(lambda c: c.__setitem__(uid, started), durable=False)
            done = started.with_state(ClaimState.PREPARE_COMPLETED, "2026-01-01T00:00:01Z")
            store.update(lambda c: c.__setitem__(uid, done))
        except Exception as err:  # collected, asserted below
            failed[uid] = err

    threads = [threading.Thread(target=prepare, args=(u,)) for u in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert list(failed) == [poisoned]
    assert isinstance(failed[poisoned], CheckpointWriteError)
    assert "claim-037" in str(failed[poisoned]) and "cannot be encoded" in str(failed[poisoned])
    durable = CheckpointStore(tmp_path / "checkpoint.json").claims()  # a fresh reader
    assert sorted(durable) == sorted(set(uids) - {poisoned})
    assert all(r.completed for r in durable.values())


def test_failed_encode_leaves_the_cache_exactly_as_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.update(lambda c: c.__setitem__("u1", record("u1")))
    before = store.claims()
    for durable in (True, False):
        with pytest.raises(CheckpointWriteError, match="cannot be encoded"):
            store.update(lambda c: c.__setitem__("u2", record("u2", extra={"x": surrogate()})),
                         durable=durable)
        assert store.claims() == before
    store.update(lambda c: c.__setitem__("u3", record("u3", device="gpu-3")))
    assert set(CheckpointStore(tmp_path / "checkpoint.json").claims()) == {"u1", "u3"}


def test_a_change_past_the_size_cap_fails_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    store.update(lambda c: c.__setitem__("u1", record("u1")))
    size = (tmp_path / "checkpoint.json").stat().st_size
    monkeypatch.setattr("agent.checkpoint.store.MAX_CHECKPOINT_BYTES", size + 10)
    with pytest.raises(CheckpointWriteError, match=r"over the \d+-byte cap"):
        store.update(lambda c: c.__setitem__("u2", record("u2", device="gpu-2")))
    assert set(store.claims()) == {"u1"}
    assert (tmp_path / "checkpoint.json").stat().st_size == size


# -- 2. hostile checkpoint files: set aside, counted, started past ---------------------------


def valid_doc(*records: ClaimRecord) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(encode(CheckpointData(claims={r.uid: r for r in records})))
    return doc


def with_checksum(doc: dict[str, Any]) -> bytes:
    doc["checksum"] = checksum(doc)
    return json.dumps(doc).encode()


def plant_checkpoint(kind: str, path: Path, good: bytes) -> None:
    """Something hostile at ``path``; ``good`` is the checkpoint that was there."""
    path.unlink()
    if kind == "deep":
        path.write_bytes(b'{"claims": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    elif kind == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "symlink-elsewhere":
        elsewhere = path.with_name("elsewhere.json")
        elsewhere.write_bytes(good)
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "over-cap":
        # Valid, checksum included: JSON allows the trailing blanks, the hash ignores them.
        path.write_bytes(good + b" " * MAX_CHECKPOINT_BYTES)
    elif kind == "bad-utf8":
        path.write_bytes(good.replace(b'"default"', b'"defa\xfflt"'))
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(kind)


HOSTILE_CHECKPOINTS = ["deep", "symlink-dev-zero", "symlink-elsewhere", "fifo", "over-cap",
                       "bad-utf8", "directory"]


@pytest.mark.parametrize("kind", HOSTILE_CHECKPOINTS)
def test_hostile_checkpoint_is_set_aside_and_the_agent_starts(node: Node, kind: str) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    node.server.stop(0)
    plant_checkpoint(kind, node.checkpoint, node.checkpoint.read_bytes())
    in_thread(node.restart)
    assert node.metrics.registry.get_sample_value("dra_agent_checkpoint_corrupt_total") == 1
    assert len(list(node.checkpoint.parent.glob("checkpoint.json.corrupt-*"))) == 1
    assert stat.S_ISREG(node.checkpoint.lstat().st_mode)
    # The spec was adopted: gpu-0 stays reserved; the node serves other claims.
    other = node.book.put(make_claim("other", ["gpu-0"]))
    assert "already prepared" in node.prepare(other)[other["metadata"]["uid"]].error
    fresh = node.book.put(make_claim("fresh", ["gpu-1"]))
    assert node.prepare(fresh)[fresh["metadata"]["uid"]].ok
    assert node.prepare(claim)[uid].ok


@pytest.mark.parametrize("kind", ["nul-uid", "bad-namespace", "nul-spec-path", "surrogate"])
def test_record_the_kubelet_path_would_refuse_is_corruption_and_the_rest_is_kept(
    node: Node, kind: str
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    node.server.stop(0)
    doc = json.loads(node.checkpoint.read_bytes())
    bad = record("bad-uid", device="gpu-5", state=ClaimState.PREPARE_STARTED,
                 spec_path=str(node.cdi_dir / "x.json")).to_json()
    bad_uid = "bad-uid"
    if kind == "nul-uid":  # at start-up a PrepareStarted record's spec is removed by UID
        bad_uid = bad["uid"] = "a\x00b"
    elif kind == "bad-namespace":
        bad["namespace"] = "../../etc"
    elif kind == "nul-spec-path":
        bad["specPath"] = "/var/run/cdi/x\x00.json"
    doc["claims"][bad_uid] = bad
    if kind == "surrogate":
        bad["name"] = surrogate()
        raw = json.dumps(doc).encode()  # no checksum can be computed: this one is stale
    else:
        raw = with_checksum(doc)
    node.checkpoint.write_bytes(raw)
    in_thread(node.restart)
    assert node.metrics.registry.get_sample_value("dra_agent_checkpoint_corrupt_total") == 1
    kept = CheckpointStore(node.checkpoint).claims()
    assert kept[uid].recovered
    # The refused record is kept as unreadable, holding its device (#28: dropping it would
    # free gpu-5 for another claim).
    [bad_kept] = [r for u, r in kept.items() if u != uid]
    assert bad_kept.unreadable and [d.device for d in bad_kept.devices] == ["gpu-5"]
    # The recovered record is written back and later writes work.
    assert node.prepare(claim)[uid].ok
    assert not CheckpointStore(node.checkpoint).claims()[uid].recovered


# -- 3. planted names in the plugin directory ------------------------------------------------


def test_symlink_at_the_old_predictable_temp_name_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    store = CheckpointStore(path)
    store.update(lambda c: c.__setitem__("u1", record("u1")))  # creates the directory
    for tid in {threading.get_ident(), threading.main_thread().ident}:
        path.with_name(f".{path.name}.{os.getpid()}.{tid}.tmp").symlink_to(victim)
    store.update(lambda c: c.__setitem__("u2", record("u2", device="gpu-2")))
    assert victim.read_text() == "precious"
    assert set(CheckpointStore(path).claims()) == {"u1", "u2"}


def test_temp_name_is_created_exclusively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoint.json"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr("agent.checkpoint.store.secrets.token_hex", lambda n: "guessed")
    path.with_name(f".{path.name}.guessed.tmp").symlink_to(victim)
    with pytest.raises(CheckpointWriteError):
        CheckpointStore(path).update(lambda c: c.__setitem__("u1", record("u1")))
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("kind", ["dangling-symlink", "symlink-to-file", "fifo"])
def test_planted_lock_path_is_never_followed(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "checkpoint.json"
    lock = tmp_path / "checkpoint.json.lock"
    target = tmp_path / "outside" / "target"
    target.parent.mkdir()
    if kind == "dangling-symlink":
        lock.symlink_to(target)
    elif kind == "symlink-to-file":
        target.write_text("precious")
        lock.symlink_to(target)
    else:
        os.mkfifo(lock)
    store = CheckpointStore(path)
    in_thread(lambda: store.update(lambda c: c.__setitem__("u1", record("u1"))))
    assert stat.S_ISREG(lock.lstat().st_mode)
    if kind == "dangling-symlink":
        assert not target.exists()  # following it would have created the target
    elif kind == "symlink-to-file":
        assert target.read_text() == "precious"
    assert len(list(tmp_path.glob("checkpoint.json.lock.corrupt-*"))) == 1
    assert set(CheckpointStore(path).claims()) == {"u1"}


@pytest.mark.parametrize("content", ["symlink", "fifo", "huge", "garbage"])
def test_hostile_boot_id_file_reads_as_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "boot_id"
    if content == "symlink":
        path.symlink_to("/dev/zero")
    elif content == "fifo":
        os.mkfifo(path)
    elif content == "huge":
        path.write_bytes(b"a" * 10_000)
    else:
        path.write_bytes(b"abc\x00def\n")
    assert in_thread(lambda: read_boot_id(path)) == ""


@pytest.fixture
def restored_process_state() -> Iterator[None]:
    """``dra-agent run`` sets the umask, signal handlers and logging of its process."""
    import logging
    import signal

    umask = os.umask(0)
    os.umask(umask)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    os.umask(umask)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    root.handlers[:], root.level = saved[0], saved[1]


@pytest.mark.usefixtures("restored_process_state")
def test_run_under_an_inherited_umask_000_creates_the_plugin_dir_0700(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.commands.run import command

    plugin_dir = tmp_path / "kubelet" / "plugins" / DRIVER

    class FakeDaemon:
        """Stands in for the daemon after the command's set-up: creates what the plugin does."""

        def __init__(self, *_args: Any, **_parts: Any) -> None:  # sockets=
            self.stop_event = threading.Event()

        def run(self) -> int:
            CheckpointStore(plugin_dir / "checkpoint.json").update(
                lambda c: c.__setitem__("u1", record("u1")))
            return 0

    monkeypatch.setattr(agent.daemon, "Daemon", FakeDaemon)
    class NoSockets:  # nor the kubelet's sockets, served before the daemon
        def stop(self, _grace_s: float) -> None:
            pass

    monkeypatch.setattr(agent.daemon.early, "serve", lambda *_args: NoSockets())
    os.umask(0)
    result = click.testing.CliRunner().invoke(
        command, ["--node-name", "node-a", "--kubelet-dir", str(tmp_path / "kubelet"),
                  "--no-health"])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(plugin_dir.stat().st_mode) == 0o700
    for name in ("checkpoint.json", "checkpoint.json.lock"):
        assert stat.S_IMODE((plugin_dir / name).stat().st_mode) == 0o600


# -- the CDI directory at start-up -------------------------------------------------------------


def good_spec(uid: str, device: str = "gpu-0") -> bytes:
    return json.dumps({"cdiVersion": "0.5.0", "kind": f"k8s.{DRIVER}/claim",
                       "devices": [{"name": f"{uid}-{device}", "containerEdits": {}}]}).encode()


def plant_spec(kind: str, path: Path, uid: str) -> None:
    if kind == "deep":
        path.write_bytes(b'{"devices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    elif kind == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "over-cap":
        path.write_bytes(good_spec(uid) + b" " * MAX_SPEC_BYTES)
    elif kind == "bad-utf8":
        path.write_bytes(good_spec(uid).replace(b"gpu-0", b"gpu-\xff"))
    elif kind == "surrogate":
        path.write_bytes(good_spec(uid).replace(b"gpu-0", b"gpu-\\ud800"))
    elif kind == "nul-device":
        path.write_bytes(good_spec(uid).replace(b"gpu-0", b"gpu-\\u0000"))
    else:
        raise AssertionError(kind)


HOSTILE_SPECS = ["deep", "symlink-dev-zero", "fifo", "over-cap", "bad-utf8", "surrogate",
                 "nul-device"]


@pytest.mark.parametrize("kind", HOSTILE_SPECS)
def test_hostile_spec_of_ours_is_set_aside_and_its_uid_still_counts(
    tmp_path: Path, kind: str
) -> None:
    specs = CDIClaimSpecs(tmp_path, DRIVER, EnvOnlyEdits(), clock=lambda: 1000.0)
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    specs.path(good).write_bytes(good_spec(good, "gpu-1"))
    plant_spec(kind, specs.path(bad), bad)
    foreign = tmp_path / "nvidia.com-gpu.json"
    foreign.symlink_to("/dev/zero")  # not ours: never opened, never moved
    assert in_thread(specs.claim_devices) == {good: ["gpu-1"], bad: []}
    assert not os.path.lexists(specs.path(bad))
    assert specs.corrupt_copies == [tmp_path / f".{specs.path(bad).name}.corrupt-1000"]
    assert os.path.lexists(foreign)


@pytest.mark.parametrize("kind", HOSTILE_SPECS)
def test_agent_starts_past_hostile_specs_and_rewrites_a_prepared_claims_spec(
    node: Node, kind: str
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    node.server.stop(0)
    spec = node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"
    spec.unlink()
    plant_spec(kind, spec, uid)
    orphan = str(uuid.uuid4())
    plant_spec(kind, node.cdi_dir / f"k8s.{DRIVER}-claim_{orphan}.json", orphan)
    before = node.metrics.cdi_spec_corrupt._value.get()
    in_thread(node.restart)
    # Both set aside; the record is intact, so start-up rebuilt the claim's spec (#15 item 4).
    assert sorted(p.name for p in node.cdi_dir.iterdir() if p.name.endswith(".json")) == [
        spec.name]
    assert node.metrics.cdi_spec_corrupt._value.get() - before == 2  # both set aside, counted
    answer = node.prepare(claim)[uid]
    assert answer.ok
    assert json.loads(spec.read_bytes())["devices"][0]["name"] == f"{uid}-gpu-0"
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600

