"""kill -9 while a GPU goes to or comes back from vfio-pci, on every vendor's simulated node:
start-up (or the kubelet's retried unprepare) gives the GPU back the driver it had, and the
claim prepares again as if nothing happened.

As in tests/prepare/test_host_undo_kill.py, the preparer runs in a child that SIGKILLs itself
at the failpoint (no cleanup, no ``finally``); the "hardware" (drivers, DRM nodes, what NVML
lists) is the simulated tree, which outlives it.
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
from agent.common.failpoints import FailpointError, Failpoints
from tests.passthrough.node import VENDORS, driver_of, make_node, preparer, published, vm_claim

REPO = Path(__file__).resolve().parents[2]
#: Every failpoint of the passthrough effect (tests/e2e/test_kill.py checks all are covered).
PASSTHROUGH_POINTS = ("gpu-vfio-after-intent", "gpu-vfio-after-bound")

CHILD = """
import json, sys
from pathlib import Path
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints
from tests.passthrough.node import preparer

root, point, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
node = preparer(root, Failpoints.parse(f"{point}=kill"))
claim = parse_claim(json.loads((root / "claim.json").read_text()))
if step == "prepare":
    node.prepare(claim)
else:
    node.unprepare(claim.ref.uid)
print("not killed")
"""


def run_child(root: Path, point: str, step: str = "prepare") -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), point, step], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr


@pytest.mark.parametrize("point", PASSTHROUGH_POINTS)
@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_kill_while_binding_then_start_up_gives_the_gpu_back(tmp_path: Path, vendor: str,
                                                             point: str) -> None:
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    raw = vm_claim(v.device)
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, point)
    left = "vfio-pci" if point == "gpu-vfio-after-bound" else v.driver
    assert driver_of(tmp_path, v.bdf) == left  # what the dead agent left

    restarted = preparer(tmp_path)
    report = restarted.recover()
    assert report.rolled_back == (raw["metadata"]["uid"],)
    assert driver_of(tmp_path, v.bdf) == v.driver
    assert restarted.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []
    assert v.gpu in published(restarted)  # its container form is offered again

    record = restarted.prepare(parse_claim(raw))  # the kubelet asks again
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert driver_of(tmp_path, v.bdf) == "vfio-pci"
    restarted.unprepare(record.uid)
    assert driver_of(tmp_path, v.bdf) == v.driver


@pytest.mark.parametrize("point", ["unprepare-after-started", "unprepare-after-spec-removed"])
@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_kill_in_unprepare_then_the_retry_gives_the_gpu_back(tmp_path: Path, vendor: str,
                                                             point: str) -> None:
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    raw = vm_claim(v.device)
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    record = preparer(tmp_path).prepare(parse_claim(raw))
    run_child(tmp_path, point, step="unprepare")

    restarted = preparer(tmp_path)
    restarted.recover()  # a completed record: start-up keeps it, and the GPU where it is
    assert set(restarted.checkpoint.claims()) == {record.uid}
    restarted.unprepare(record.uid)  # the kubelet's retry
    assert driver_of(tmp_path, v.bdf) == v.driver
    assert restarted.checkpoint.claims() == {}
    assert v.gpu in published(restarted)


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_a_prepare_failing_after_the_bind_gives_the_gpu_back(tmp_path: Path,
                                                             vendor: str) -> None:
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    for point in (*PASSTHROUGH_POINTS, "prepare-after-spec-written", "prepare-after-completed"):
        failing = preparer(tmp_path, Failpoints.parse(f"{point}=error"))
        with pytest.raises(FailpointError):
            failing.prepare(parse_claim(vm_claim(v.device)))
        assert driver_of(tmp_path, v.bdf) == v.driver, point
        assert failing.checkpoint.claims() == {}, point
