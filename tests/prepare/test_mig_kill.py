"""kill -9 at every step of a dynamic MIG prepare and unprepare, then start-up and the kubelet's
retry: the GPU ends with exactly the instances prepared claims hold, nothing half-made.

The preparer runs in a child process that SIGKILLs itself at the failpoint (no cleanup, no
``finally``); the NVML fake keeps its instances in a file, as a GPU keeps them across an
agent's death, so the restarted preparer meets the hardware the dead one left.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.checkpoint.model import ClaimState
from agent.claim.parse import parse_claim
from agent.prepare.effects.miginstance import instance_of
from tests.plugnode import make_claim
from tests.prepare.migsetup import mig_node

REPO = Path(__file__).resolve().parents[2]
DEVICES = ["gpu-0-mig-3g40gb-4", "gpu-0-mig-1g10gb-0"]
PREPARE_POINTS = ("mig-after-intent", "mig-after-gi-created", "mig-after-ids-recorded")
UNPREPARE_POINTS = ("mig-after-destroyed",)
MIG_POINTS = PREPARE_POINTS + UNPREPARE_POINTS

CHILD = """
import json, sys
from pathlib import Path
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints
from tests.prepare.migsetup import mig_node

root, point, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
claim = parse_claim(json.loads((root / "claim.json").read_text()))
if step == "prepare":
    mig_node(root, failpoints=Failpoints.parse(f"{point}=kill")).preparer.prepare(claim)
else:
    node = mig_node(root, failpoints=Failpoints.parse(f"{point}=kill"))
    node.preparer.unprepare(claim.ref.uid)
print("not killed")
"""


def run_child(root: Path, point: str, step: str) -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), point, step], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_kill_during_prepare_then_start_up_and_retry(tmp_path: Path, point: str) -> None:
    raw = make_claim("train", DEVICES)
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, point, "prepare")

    node = mig_node(tmp_path)  # the restarted agent, on the same GPU
    node.preparer.recover()
    assert node.migs(0) == [], f"{point}: instances left behind"
    assert node.preparer.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []
    assert node.migs(4) == [(2, 0, 9, 0)]  # the foreign instance, untouched

    record = node.preparer.prepare(parse_claim(raw))  # the kubelet asks again
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert sorted(m[2:] for m in node.migs(0)) == [(9, 4), (19, 0)]
    node.preparer.unprepare(record.uid)
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}


@pytest.mark.parametrize("point", ["prepare-after-spec-written", "prepare-after-completed"])
def test_kill_after_the_partitions_exist(tmp_path: Path, point: str) -> None:
    raw = make_claim("train", DEVICES)
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, point, "prepare")
    node = mig_node(tmp_path)
    node.preparer.recover()
    records = node.preparer.checkpoint.claims()
    if point == "prepare-after-completed":  # done: kept, and the retry is answered as it was
        assert sorted(m[2:] for m in node.migs(0)) == [(9, 4), (19, 0)]
        [record] = records.values()
        again = node.preparer.prepare(parse_claim(raw))
        assert again.devices == record.devices
    else:
        assert node.migs(0) == [] and records == {}
        again = node.preparer.prepare(parse_claim(raw))
    node.preparer.unprepare(again.uid)
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}


def test_kill_during_unprepare_then_the_kubelets_retry_leaves_nothing(tmp_path: Path) -> None:
    raw = make_claim("train", DEVICES)
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    first = mig_node(tmp_path).preparer.prepare(parse_claim(raw))
    run_child(tmp_path, "mig-after-destroyed", "unprepare")

    node = mig_node(tmp_path)
    assert node.migs(0) == []  # destroyed before the kill; the record still names them
    node.preparer.recover()  # the claim is still prepared: its partitions come back
    held = node.preparer.checkpoint.claims()[first.uid].devices
    assert all(instance_of(d) is not None and instance_of(d).created for d in held)  # type: ignore[union-attr]
    assert len(node.migs(0)) == 2
    node.preparer.unprepare(first.uid)  # the kubelet's retry
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}
