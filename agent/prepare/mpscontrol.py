"""The MPS control daemon's server-side limits, behind one seam.

``MpsControl`` is what the MPS effect (``agent.prepare.effects.mps``) calls:
``NvidiaMpsControl`` on a node (``nvidia-cuda-mps-control``, one command on stdin per run,
against the daemon of ``--mps-pipe-dir``), ``RecordingMpsControl`` on a simulated node and in
tests.

What MPS allows, from NVIDIA's MPS documentation (Legacy MPS v2, the interface of a daemon
started with ``nvidia-cuda-mps-control -d``):

* ``set_default_active_thread_percentage <pct>`` and ``set_default_device_pinned_mem_limit
  <dev> <value>`` set the defaults of the servers the daemon starts *later*: "If there is
  already a server spawned, this command will only affect the next server. The set value is
  lost if a quit command is executed." ``<dev>`` is a GPU UUID or an ordinal, ``<value>`` an
  integer followed by ``M`` or ``G``. By default the thread percentage is 100 and "there is
  no memory limit set" (no command unsets one, so the agent's reset is the GPU's whole
  memory).
* ``set_active_thread_percentage <PID> <pct>`` and ``set_device_pinned_mem_limit <PID> <dev>
  <value>`` set a running server's: "All clients created with that server afterwards will
  observe the new limit. Existing clients are not affected." ``get_server_list`` prints the
  servers' PIDs. Source: https://docs.nvidia.com/deploy/mps/mpsv2-interface.html
* A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  "will only further constrain the limit set by the control daemon": a client lowers its
  bound, it never rises above the server's. Source:
  https://docs.nvidia.com/deploy/mps/appendix-environment-variables.html
* "The control daemon allows at most one MPS server to be active at a time", launched with
  the UID of the client that asked for it; a client of another UID waits until that server's
  clients are gone (unless the daemon runs with ``-multiuser-server``, where every client
  joins root's server). Source: https://docs.nvidia.com/deploy/mps/architecture.html

So the limits are one per server (threads; memory per server and GPU), never one per client,
and every MPS share of the node is a client of the same server. What the agent can enforce:
no client of the server rises above the largest bound among the prepared MPS shares (the
thread percentage node-wide, the pinned memory per GPU); a share's own, smaller bound stays
its containers' variable, which they can raise up to that ceiling. A client keeps the limit
it was created under until it exits. Per-client limits on the server side would need MPS
v3's namespaces (one per claim, its own pipe directory), which this agent does not use.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from agent.prepare.standin import find_driver_tool, load_state, save_state

BINARY = "nvidia-cuda-mps-control"
#: A set command's answer: nothing, or the value it now holds ("25.0", "20480M", "20G").
_SET_REPLY = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?[MG]?)?$")


class MpsControlError(Exception):
    """The MPS control daemon refused or did not answer; the message says which and why."""


class MpsControl(Protocol):
    """The MPS server's limits (the seam tests and --simulate fill). Each applies to the
    servers the daemon starts from now on and to every running one's new clients."""

    def set_active_thread_percentage(self, percent: int) -> None:
        """The most of each GPU's threads a client may use, 1..100; MpsControlError."""
        ...

    def set_pinned_memory_limit(self, gpu: str, mib: int) -> None:
        """The most device memory (MiB) a client may pin on GPU ``gpu`` (its UUID)."""
        ...


class NvidiaMpsControl:
    """``MpsControl`` through ``nvidia-cuda-mps-control`` against the daemon whose pipe
    directory is ``pipe_dir`` (``CUDA_MPS_PIPE_DIRECTORY``)."""

    def __init__(self, binary: Path, pipe_dir: Path,
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
                 timeout_s: float = 10.0, environ: Mapping[str, str] | None = None) -> None:
        self.binary = binary
        self.pipe_dir = pipe_dir
        self._run = run
        self.timeout_s = timeout_s
        self._env = {**(os.environ if environ is None else environ),
                     "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}

    def set_active_thread_percentage(self, percent: int) -> None:
        self._set(f"set_default_active_thread_percentage {percent}",
                  lambda pid: f"set_active_thread_percentage {pid} {percent}")

    def set_pinned_memory_limit(self, gpu: str, mib: int) -> None:
        self._set(f"set_default_device_pinned_mem_limit {gpu} {mib}M",
                  lambda pid: f"set_device_pinned_mem_limit {pid} {gpu} {mib}M")

    def _set(self, default: str, per_server: Callable[[int], str]) -> None:
        # The default first: a server the daemon starts after it has the new limit, so no
        # server slips between the list and the per-server commands.
        self._answer(default, setting=True)
        for pid in self._servers():
            try:
                self._answer(per_server(pid), setting=True)
            except MpsControlError:
                if pid in self._servers():
                    raise
                # It exited since it was listed: the daemon's next one has the default.

    def _servers(self) -> tuple[int, ...]:
        said = self._answer("get_server_list").split()
        if not all(p.isdigit() for p in said):
            raise MpsControlError(f"{BINARY} get_server_list: not a list of server PIDs: "
                                  f"{' '.join(said)[:200]}")
        return tuple(int(p) for p in said)

    def _answer(self, line: str, *, setting: bool = False) -> str:
        """The daemon's answer to one command, or MpsControlError with what it said."""
        try:
            done = self._run([str(self.binary)], input=line + "\n", capture_output=True,
                             text=True, timeout=self.timeout_s, check=False, env=self._env)
        except subprocess.TimeoutExpired as err:
            raise MpsControlError(f"{BINARY} did not answer within {self.timeout_s:g} s "
                                  f"(is the daemon of {self.pipe_dir} wedged?)") from err
        except OSError as err:
            raise MpsControlError(f"{self.binary} did not run: {err}") from err
        said = " ".join((done.stdout or "").split())
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout or "no output").split())[:200]
            raise MpsControlError(f"{BINARY} exit {done.returncode}: {why}")
        if setting and not _SET_REPLY.match(said):
            # A refusal comes back as text (exit 0): anything but the value is one.
            raise MpsControlError(f"{BINARY} said: {said[:200]}")
        return said


class RecordingMpsControl:
    """``MpsControl`` of a simulated node: remembers the limits, changes nothing.

    With ``state`` the limits are kept in that JSON file, as the control daemon keeps them
    when the agent dies; an unreadable file is a daemon that never got a limit, as after it
    quit. ``failure``: the error every call raises (a test's refusing daemon).
    """

    def __init__(self, state: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.state = state
        self.thread_percentage: int | None = None
        self.pinned_mib: dict[str, int] = {}
        self.calls: list[tuple[object, ...]] = []
        self.failure: str | None = None
        if state is not None:
            self._load(state)

    def _load(self, state: Path) -> None:
        loaded = load_state(state)
        threads = loaded.get("activeThreadPercentage")
        self.thread_percentage = threads if isinstance(threads, int) else None
        memory = loaded.get("pinnedMemoryMiB")
        if isinstance(memory, dict):
            self.pinned_mib = {k: v for k, v in memory.items()
                               if isinstance(k, str) and isinstance(v, int)}

    def set_active_thread_percentage(self, percent: int) -> None:
        with self._lock:
            self.calls.append(("threads", percent))
            if self.failure is not None:
                raise MpsControlError(self.failure)
            self.thread_percentage = percent
            self._save()

    def set_pinned_memory_limit(self, gpu: str, mib: int) -> None:
        with self._lock:
            self.calls.append(("memory", gpu, mib))
            if self.failure is not None:
                raise MpsControlError(self.failure)
            self.pinned_mib[gpu] = mib
            self._save()

    def _save(self) -> None:
        if self.state is None:
            return
        save_state(self.state, {"activeThreadPercentage": self.thread_percentage,
                                "pinnedMemoryMiB": self.pinned_mib})


def find_mps_control(driver_root: Path) -> Path | None:
    """nvidia-cuda-mps-control of the driver the node runs (``find_driver_tool``)."""
    return find_driver_tool(driver_root, BINARY)
