"""Failpoints: the parser, the ``error`` action at every step through the real gRPC path, and
one real ``kill -9`` in a child process followed by recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.checkpoint.codec import decode
from agent.checkpoint.model import ClaimState
from agent.checkpoint.store import CheckpointStore
from agent.claim.parse import parse_claim
from agent.common.failpoints import (
    ENV,
    Action,
    FailpointConfigError,
    FailpointError,
    Failpoints,
    Kind,
    Point,
)
from agent.prepare import CDIClaimSpecs, EnvOnlyEdits
from discovery.model import Inventory
from tests.conftest import REPO
from tests.plugnode import DRIVER, Node, device_preparer, gpu, make_claim


def test_parse_points_actions_and_aliases() -> None:
    fp = Failpoints.parse(" prepare-after-get=kill, unprepare-after-started=sleep:250 ,"
                          "prepare-before-answer=error,")
    assert fp.actions == {
        Point.PREPARE_AFTER_CLAIM_GET: Action(Kind.KILL),
        Point.UNPREPARE_AFTER_STARTED: Action(Kind.SLEEP, 250),
        Point.PREPARE_BEFORE_ANSWER: Action(Kind.ERROR),
    }


def test_unset_or_empty_variable_means_no_failpoints() -> None:
    assert Failpoints.from_env({}) is None
    assert Failpoints.from_env({ENV: "  "}) is None
    assert Failpoints.from_env({ENV: ","}) is None
    fp = Failpoints.from_env({ENV: "prepare-after-started=error"})
    assert fp is not None and list(fp.actions) == [Point.PREPARE_AFTER_STARTED]


@pytest.mark.parametrize(("text", "message"), [
    ("prepare-after-lunch=kill", "unknown failpoint.*prepare-after-claim-get"),
    ("prepare-after-started=explode", "unknown action"),
    ("prepare-after-started=sleep", "sleep needs milliseconds"),
    ("prepare-after-started=sleep:-1", "sleep needs milliseconds"),
    ("prepare-after-started=kill:now", "unknown action"),
    ("prepare-after-started", "expected <point>=<action>"),
    ("prepare-after-get=kill,prepare-after-claim-get=error", "given twice"),
])
def test_bad_failpoint_settings_fail_at_start(text: str, message: str) -> None:
    with pytest.raises(FailpointConfigError, match=message):
        Failpoints.from_env({ENV: text})


def test_sleep_action_stalls_and_hits_are_counted(node: Node) -> None:
    fp = Failpoints.parse("prepare-after-started=sleep:1")
    node.server.framework.failpoints = fp
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    assert node.prepare(claim)[claim["metadata"]["uid"]].ok
    assert node.unprepare(claim)[claim["metadata"]["uid"]].ok
    # Every point of a plain claim; dynamic MIG's are hit by partitions (test_mig_kill.py),
    # the VF and time-slice ones by those steps (test_host_undo_kill.py), GPU passthrough's
    # by a GPU's VFIO form (tests/passthrough/test_kill.py).
    assert fp.hits == {p: 1 for p in Point
                       if not p.value.startswith(("mig-", "vf-", "time-slice-", "gpu-vfio-"))}


def spec_of(node: Node, uid: str) -> Path:
    return node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"


def records(node: Node) -> dict[str, ClaimState]:
    if not node.checkpoint.exists():
        return {}
    return {u: r.state for u, r in decode(node.checkpoint.read_bytes()).claims.items()}


@pytest.mark.parametrize("point", [
    Point.PREPARE_AFTER_CLAIM_GET, Point.PREPARE_AFTER_STARTED, Point.PREPARE_AFTER_SPEC_WRITTEN,
    Point.PREPARE_AFTER_COMPLETED, Point.PREPARE_BEFORE_ANSWER,
])
def test_injected_prepare_error_is_the_claims_answer_and_the_retry_works(
    node: Node, point: Point
) -> None:
    node.server.framework.failpoints = Failpoints(
        {point: Action(Kind.ERROR)})
    claim = node.book.put(make_claim("c1", ["gpu-0", "gpu-1"]))
    uid = claim["metadata"]["uid"]
    out = node.prepare(claim)[uid]
    assert f"failpoint {point}: injected error" in out.error
    if point is Point.PREPARE_BEFORE_ANSWER:  # everything was done; only the answer failed
        assert records(node) == {uid: ClaimState.PREPARE_COMPLETED}
    else:  # rolled back: nothing reserved, no spec
        assert records(node) == {} and not spec_of(node, uid).exists()
    node.server.framework.failpoints = None
    again = node.prepare(claim)[uid]  # the kubelet retries
    assert again.ok and len(again.devices) == 2 and spec_of(node, uid).exists()
    assert node.unprepare(claim)[uid].ok
    assert records(node) == {} and not spec_of(node, uid).exists()


@pytest.mark.parametrize(("point", "spec_left", "record_left"), [
    (Point.UNPREPARE_AFTER_STARTED, True, True),
    (Point.UNPREPARE_AFTER_SPEC_REMOVED, False, True),
    (Point.UNPREPARE_AFTER_COMPLETED, False, False),
    (Point.UNPREPARE_BEFORE_ANSWER, False, False),
])
def test_injected_unprepare_error_leaves_a_state_the_retry_finishes(
    node: Node, point: Point, spec_left: bool, record_left: bool
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-3"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    node.server.framework.failpoints = Failpoints(
        {point: Action(Kind.ERROR)})
    assert f"failpoint {point}" in node.unprepare(claim)[uid].error
    assert spec_of(node, uid).exists() is spec_left
    assert (uid in records(node)) is record_left
    node.server.framework.failpoints = None
    assert node.unprepare(claim)[uid].ok
    assert records(node) == {} and not spec_of(node, uid).exists()


CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from agent.checkpoint.store import CheckpointStore
    from agent.claim.parse import parse_claim
    from agent.common.failpoints import Failpoints
    from discovery.model import Inventory
    from tests.plugnode import device_preparer, gpu

    root = Path(sys.argv[1])
    preparer = device_preparer(
        root, lambda: Inventory(devices=(gpu(0),)),
        checkpoint=CheckpointStore(root / "checkpoint.json"),
        failpoints=Failpoints.from_env(os.environ),
    )
    preparer.prepare(parse_claim(json.loads((root / "claim.json").read_text())))
    print("survived")
""")


def test_kill_failpoint_is_a_real_kill_9_and_the_next_start_recovers(tmp_path: Path) -> None:
    claim = make_claim("c1", ["gpu-0"])
    uid = claim["metadata"]["uid"]
    (tmp_path / "claim.json").write_text(json.dumps(claim))
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV: "prepare-after-spec-written=kill"}
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "survived" not in child.stdout
    specs = CDIClaimSpecs(tmp_path / "cdi", DRIVER, EnvOnlyEdits())
    assert specs.path(uid).exists()  # killed between the spec and PrepareCompleted

    store = CheckpointStore(tmp_path / "checkpoint.json")
    restarted = device_preparer(tmp_path, lambda: Inventory(devices=(gpu(0),)),
                                checkpoint=store)
    report = restarted.recover()
    assert report.orphans_removed == (uid,) and not specs.path(uid).exists()
    assert store.claims() == {}
    assert restarted.prepare(parse_claim(claim)).completed  # the kubelet's retry


def test_error_action_raises_a_typed_error() -> None:
    fp = Failpoints({Point.UNPREPARE_AFTER_COMPLETED: Action(Kind.ERROR)})
    fp.hit(Point.PREPARE_AFTER_STARTED)  # not enabled: nothing happens, but it is counted
    with pytest.raises(FailpointError) as info:
        fp.hit(Point.UNPREPARE_AFTER_COMPLETED, "uid-1")
    assert info.value.point is Point.UNPREPARE_AFTER_COMPLETED
    assert fp.hits[Point.PREPARE_AFTER_STARTED] == 1
