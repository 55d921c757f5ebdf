"""The whole one-node cluster of hack/realk8s/node-up.sh, driven as a user drives one: kubectl
and helm inside the node's namespaces (hack/realk8s/node-exec.sh), files read through the
node's mount namespace (``/proc/<holder>/root``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
REALK8S = ROOT / "hack" / "realk8s"
BIN = REALK8S / "bin"
EXAMPLES = ROOT / "examples"
NODE_BINARIES = [BIN / "1.37" / b for b in ("etcd", "kube-apiserver", "kube-controller-manager",
                                             "kube-scheduler", "kubelet", "kubectl")]
NODE_BINARIES += [BIN / "node" / b for b in ("containerd", "containerd-shim-runc-v2", "ctr")]
NODE_BINARIES += [BIN / "helm"]


class CommandFailedError(AssertionError):
    pass


@dataclass
class Node:
    """A running node-up.sh cluster in ``dir``."""

    dir: Path
    name: str

    @classmethod
    def up(cls, dir: Path, images: Path) -> Node:
        # -v=2: the DRA plugin manager's registrations and connections, for a failure's
        # report (dra_log).
        out = subprocess.run([str(REALK8S / "node-up.sh"), "--images", str(images),
                              "--kubelet-arg", "-v=2", str(dir)],
                             capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            subprocess.run([str(REALK8S / "down.sh"), str(dir)], capture_output=True, timeout=120,
                           check=False)
            raise CommandFailedError(f"node-up.sh failed: {out.stderr.strip()[-2000:]}")
        return cls(dir, out.stdout.strip().splitlines()[-1])

    def down(self) -> None:
        subprocess.run([str(REALK8S / "down.sh"), str(self.dir)], capture_output=True,
                       timeout=180, check=False)

    # -- the node's environment --------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for name in ("cluster.env", "node.env"):
            for line in (self.dir / name).read_text().splitlines():
                key, _, value = line.partition("=")
                values[key] = value
        return values

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists as the node's mount namespace sees it (its /run is a tmpfs
        of its own; /proc/<pid>/root would resolve the /var/run symlink on the host's)."""
        return self.run("test", "-e", path, check=False).returncode == 0

    # -- commands -----------------------------------------------------------------------------

    def run(self, *cmd: str, input: str | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(REALK8S / "node-exec.sh"), str(self.dir), *cmd], input=input,
                             capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
        if check and out.returncode != 0:
            raise CommandFailedError(f"{' '.join(cmd)} exited {out.returncode}: "
                                f"{(out.stderr or out.stdout).strip()[-2000:]}")
        return out

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> str:
        return self.run("kubectl", *args, input=input, check=check, timeout=timeout).stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, check=check, timeout=300)

    def restart_kubelet(self) -> None:
        """Stops the kubelet (SIGTERM, as systemd does) and starts it again with the same
        command line in the node's namespaces: its Pods' containers keep running meanwhile."""
        env = self.env
        pid = int(env["KUBELET_PID"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}/cmdline").exists()
                 or not Path(f"/proc/{pid}/cmdline").read_bytes(),
                 timeout=30, interval=0.1, what="the kubelet stopped")
        log = (self.dir / "node" / "logs" / "kubelet.log").open("ab")
        with log:
            proc = subprocess.Popen(["nsenter", "--target", env["HOLDER_PID"], "--net", "--mount",
                                     "--", "setsid", *(a.decode() for a in argv)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        # node-up.sh's node.env names the kubelet down.sh stops: the new one now.
        text = (self.dir / "node.env").read_text()
        (self.dir / "node.env").write_text(
            text.replace(f"KUBELET_PID={pid}\n", f"KUBELET_PID={proc.pid}\n"))

    def dra_log(self) -> str:
        """The kubelet's lines about DRA plugins (registration, connections), for a failure."""
        lines = (self.dir / "node" / "logs" / "kubelet.log").read_text(errors="replace")
        keep = [line[:400] for line in lines.splitlines() if "DRA" in line or "plugin" in line]
        return "\n".join(keep[-60:])

    # -- waiting ------------------------------------------------------------------------------

    def pod(self, ns: str, name: str) -> Any:
        out = self.kubectl("-n", ns, "get", "pod", name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def wait_running(self, ns: str, name: str, timeout: float = 90) -> Any:
        def running() -> Any:
            pod = self.pod(ns, name)
            phase = (pod or {}).get("status", {}).get("phase")
            if phase in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {ns}/{name} ended {phase}: {pod['status']}")
            ready = [c for c in (pod or {}).get("status", {}).get("conditions", [])
                     if c["type"] == "Ready" and c["status"] == "True"]
            return pod if phase == "Running" and ready else None
        try:
            return wait_for(running, timeout=timeout, interval=0.25, what=f"pod {ns}/{name} Ready")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.describe(ns, name)}") from None

    def wait_logged(self, ns: str, name: str, text: str, container: str | None = None,
                    timeout: float = 30) -> str:
        args = ["-n", ns, "logs", name] + (["-c", container] if container else [])
        def logged() -> str | None:
            out = self.kubectl(*args, check=False)
            return out if text in out else None
        return str(wait_for(logged, timeout=timeout, interval=0.25,
                            what=f"'{text}' in {name}'s log"))

    def wait_gone(self, *args: str, timeout: float = 90) -> None:
        wait_for(lambda: not self.kubectl("get", *args, "--ignore-not-found", "-o", "name").strip(),
                 timeout=timeout, interval=0.25, what=f"{' '.join(args)} gone")

    def describe(self, ns: str, name: str) -> str:
        return self.kubectl("-n", ns, "describe", "pod", name, check=False)[-3000:]

    def scheduling_message(self, ns: str, name: str) -> str:
        """The scheduler's reason a Pod is Pending (its PodScheduled condition)."""
        def reason() -> str | None:
            pod = self.pod(ns, name) or {}
            for c in pod.get("status", {}).get("conditions", []):
                if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                    return str(c["message"])
            return None
        return str(wait_for(reason, timeout=60, interval=0.25, what=f"{name}'s scheduling reason"))


def stays(check: Any, seconds: float, interval: float = 0.5) -> bool:
    """True when ``check()`` stays truthy for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return False
        time.sleep(interval)
    return True
