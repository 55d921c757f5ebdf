"""What ``dra-agent run`` sets the MPS server's limits with (``agent.daemon.machine``): nothing
without ``--mps-pipe-dir``, a recording stand-in beside the checkpoint on a simulated node,
the driver's nvidia-cuda-mps-control against the named daemon on a real one, and nothing
(every MPS share refused in one line) where that binary is not found."""

from __future__ import annotations

from pathlib import Path

from agent.common.config import Config
from agent.daemon import machine
from agent.daemon.options import RunOptions
from agent.prepare.mpscontrol import NvidiaMpsControl, RecordingMpsControl

PIPE = Path("/tmp/nvidia-mps")


def test_no_pipe_directory_no_mps_control(tmp_path: Path) -> None:
    assert machine.mps_control(Config(kubelet_dir=tmp_path), RunOptions()) is None


def test_a_simulated_node_records_the_limits_beside_its_checkpoint(tmp_path: Path) -> None:
    cfg = Config(kubelet_dir=tmp_path, simulate="dgx-h100")
    control = machine.mps_control(cfg, RunOptions(mps_pipe_dir=PIPE))
    assert isinstance(control, RecordingMpsControl)
    assert control.state == cfg.plugin_dir / machine.SIMULATED_MPS_STATE


def test_a_real_node_drives_the_drivers_control_binary(tmp_path: Path) -> None:
    binary = tmp_path / "driver" / "usr" / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    control = machine.mps_control(Config(kubelet_dir=tmp_path),
                                  RunOptions(mps_pipe_dir=PIPE, driver_root=tmp_path / "driver"))
    assert isinstance(control, NvidiaMpsControl)
    assert (control.binary, control.pipe_dir) == (binary, PIPE)
