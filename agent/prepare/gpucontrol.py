"""GPU-wide settings the agent changes for shares of an NVIDIA GPU, behind one seam.

``GpuControl`` is what the time-slice effect (``agent.prepare.effects.timeslice``) calls:
``NvidiaSmi`` on a node (NVML has no call for the interval), ``RecordingGpuControl`` on a
simulated node and in tests.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.claim.opaque import TIME_SLICES
from agent.prepare.standin import find_driver_tool, load_state, save_state

log = logging.getLogger(__name__)

class GpuControlError(Exception):
    """The GPU refused a setting; the message names the GPU and the cause."""


class GpuControl(Protocol):
    """GPU-wide settings the agent changes for shares (the seam tests and --simulate fill)."""

    def set_time_slice(self, uuid: str, level: str) -> None:
        """Set the GPU's time-slice interval (a ``TIME_SLICES`` name); GpuControlError."""
        ...


class NvidiaSmi:
    """``GpuControl`` through ``nvidia-smi compute-policy`` (NVML has no call for it)."""

    def __init__(self, binary: Path, run: Callable[..., subprocess.CompletedProcess[str]]
                 = subprocess.run, timeout_s: float = 20.0) -> None:
        self.binary = binary
        self._run = run
        self.timeout_s = timeout_s

    def set_time_slice(self, uuid: str, level: str) -> None:
        args = [str(self.binary), "compute-policy", "-i", uuid,
                f"--set-timeslice={TIME_SLICES[level]}"]
        try:
            done = self._run(args, capture_output=True, text=True, timeout=self.timeout_s,
                             check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise GpuControlError(f"{self.binary} did not run: {err}") from err
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout or "no output").split())[:200]
            raise GpuControlError(f"nvidia-smi exit {done.returncode}: {said}")


class RecordingGpuControl:
    """``GpuControl`` of a simulated node: remembers each GPU's interval, changes nothing.

    With ``state`` the intervals are kept in that JSON file, as a GPU keeps its interval when
    the agent dies: a restarted agent (or a crash test's next process) meets what the dead
    one set. An unreadable file is an empty GPU state, as after a reboot.
    """

    def __init__(self, state: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.state = state
        self.time_slices: dict[str, str] = {}
        if state is not None:
            self.time_slices = {k: v for k, v in load_state(state).items()
                                if isinstance(k, str) and isinstance(v, str)}
        self.calls: list[tuple[str, str]] = []
        #: uuid -> error to raise (a test's stand-in for a GPU that refuses).
        self.failures: dict[str, str] = {}

    def set_time_slice(self, uuid: str, level: str) -> None:
        with self._lock:
            self.calls.append((uuid, level))
            if uuid in self.failures:
                raise GpuControlError(self.failures[uuid])
            self.time_slices[uuid] = level
            if self.state is not None:
                save_state(self.state, dict(self.time_slices))


def find_nvidia_smi(driver_root: Path) -> Path | None:
    """nvidia-smi of the driver the node runs (``find_driver_tool``)."""
    return find_driver_tool(driver_root, "nvidia-smi")


