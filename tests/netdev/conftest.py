"""Network namespaces the tests make themselves, each with one end of a veth pair whose other
end is in a second namespace of the test's: no test touches an interface of the host's.

Needs root and iproute2 (``ip netns add``); elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.netdev.install import HookLaunch, read_launch

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Pod:
    """A namespace playing a pod's: ``name`` for ``ip -n``, ``pid`` of a process inside it
    (the OCI state's ``pid``), ``interface`` the veth end in it, ``peer`` (the far end's
    namespace)."""

    name: str
    peer: str
    pid: int
    interface: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"

    def ip(self, *args: str) -> object:
        """``ip -j -n NAME ARGS`` decoded."""
        out = subprocess.run(["ip", "-j", "-n", self.name, *args], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out or "[]")

    def ip_text(self, *args: str) -> str:
        return subprocess.run(["ip", "-n", self.name, *args], check=True,
                              capture_output=True, text=True).stdout


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def pod() -> Iterator[Pod]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    tag = uuid.uuid4().hex[:8]
    name, peer = f"dra-pod-{tag}", f"dra-peer-{tag}"
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot make a network namespace: {err.stderr.decode().strip()}")
    _run("ip", "netns", "add", peer)
    sleeper = None
    try:
        # Made inside the peer namespace, so the host's namespace never holds the veth.
        _run("ip", "-n", peer, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
             "netns", name)
        _run("ip", "-n", name, "link", "set", "v1", "name", "net1")
        sleeper = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
        pid = sleeper.pid
        # `ip netns exec` execs sleep in the same process once it has entered the namespace.
        target = os.stat(f"/run/netns/{name}").st_ino
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{pid}/ns/net").st_ino != target:
            assert time.monotonic() < deadline, "the sleeper never entered the namespace"
            time.sleep(0.01)
        yield Pod(name=name, peer=peer, pid=pid, interface="net1")
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", peer], check=False, capture_output=True)


@pytest.fixture(scope="session")
def launch(tmp_path_factory: pytest.TempPathFactory) -> HookLaunch:
    """The hook installed as the chart's init container installs it, into a test directory."""
    dest = tmp_path_factory.mktemp("hook")
    subprocess.run([sys.executable, "-m", "agent.netdev.install", str(dest)], check=True,
                   cwd=REPO, capture_output=True, env={"PYTHONPATH": str(REPO)})
    found = read_launch(dest)
    assert found is not None
    return found


def run_hook(launch: HookLaunch, state: object, *args: str,
             path: str | None = None) -> subprocess.CompletedProcess[str]:
    """The hook as the runtime runs it: empty environment, the OCI state on stdin."""
    return subprocess.run([path or launch.path, *launch.args[1:], *args],
                          input=json.dumps(state), capture_output=True, text=True, env={},
                          timeout=30, check=False)
