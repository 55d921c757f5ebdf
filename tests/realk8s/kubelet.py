"""The kubelet's own DRA code as a process (bin/<minor>/kubelet-dra, hack/realk8s/tools):
the real cm/dra Manager and plugin manager, driven one JSON line at a time."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.realk8s.cluster import bin_dir


class KubeletDRA:
    """``kubelet-dra`` on ``root`` (the kubelet dir: plugins_registry and the state file)."""

    def __init__(self, minor: str, kubeconfig: Path, node: str, root: Path,
                 *, feature_gates: str = "") -> None:
        self.args = [str(bin_dir(minor) / "kubelet-dra"), f"--kubeconfig={kubeconfig}",
                     f"--node-name={node}", f"--root-dir={root}"]
        if feature_gates:
            self.args.append(f"--feature-gates={feature_gates}")
        self.log = root / "kubelet-dra.log"
        root.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = self.log.open("a")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        # One request at a time on the pipe: a test may drive it from a second thread.
        self._lock = threading.Lock()

    def call(self, op: str, timeout: float = 60, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"kubelet-dra exited ({self.proc.poll()}):\n{self.logs()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def prepare(self, pod: Mapping[str, Any]) -> str:
        """'' when the pod's claims are prepared, else the kubelet's error."""
        return str(self.call("prepare", pod=pod).get("error", ""))

    def unprepare(self, pod: Mapping[str, Any]) -> str:
        return str(self.call("unprepare", pod=pod).get("error", ""))

    def resources(self, pod: Mapping[str, Any], container: str) -> list[str]:
        answer = self.call("resources", pod=pod, container=container)
        assert "error" not in answer, answer
        devices: list[str] = answer.get("cdiDevices", [])
        return devices

    def active(self, pods: Sequence[Mapping[str, Any]]) -> None:
        assert self.call("active", pods=list(pods)) == {}

    def registered(self, *drivers: str) -> dict[str, bool]:
        """driver -> whether the DRA manager finds it (what a prepare for it would see)."""
        plugins: dict[str, bool] = self.call("plugins", drivers=list(drivers))["plugins"]
        return plugins

    def plugins(self) -> list[dict[str, Any]]:
        """Every plugin instance the kubelet holds registered: ``driver``, ``endpoint``,
        ``service`` (the chosen DRA service) and ``connected``, by driver, each driver's in
        registration order (calls go to the newest connected one)."""
        answer = self.call("plugins")
        assert "error" not in answer, answer
        registered: list[dict[str, Any]] = answer["registered"]
        return registered

    def health(self, pod: Mapping[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """container -> the allocatedResourcesStatus the kubelet would write for it, and the
        pod UIDs the manager asked to have resynced since the last call."""
        answer = self.call("health", pod=pod)
        assert "error" not in answer, answer
        health: dict[str, list[dict[str, Any]]] = answer.get("health", {})
        notified: list[str] = answer.get("notified", [])
        return health, notified

    def logs(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of requests: it exits
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
