"""The daemon serves the kubelet's sockets first (agent.daemon.early): the registration answers
while discovery still runs, yet /readyz passes only once everything is up, and a start that
fails later is one line and exit 1 with both sockets removed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.common.config import Config
from agent.daemon import Daemon, RunOptions, probes
from agent.daemon import daemon as daemon_module
from tests.conftest import REPO
from tests.e2e.harness import NODE, AgentProcess, NodeDirs
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn
from tests.waiting import wait_for

DRIVER = "dra-agent.io"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def short() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="es", dir="/tmp"))  # socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_registered_while_discovery_runs_and_ready_only_after(
        short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = daemon_module.discover

    def slow_discover(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(30), "the test never released discovery"
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon_module, "discover", slow_discover)
    cfg = Config(driver_name=DRIVER, node_name="node-es", kubeconfig="none",
                 kubelet_dir=short / "k", cdi_dir=short / "cdi", simulate="dgx-h100",
                 metrics_address="127.0.0.1:0")
    agent = Daemon(cfg, RunOptions(health=None, slow_rescan_s=3600), environ={})
    starting = threading.Thread(target=agent.start, daemon=True)
    starting.start()
    try:
        with KubeletStandIn(short / "k" / "plugins_registry", poll_interval=0.01) as kubelet:
            kubelet.wait_registered(DRIVER, timeout=20)  # GetInfo and the notice, answered
            assert starting.is_alive()  # discovery still holds the start
            assert agent.http is None and agent.plugin is None  # no /readyz to pass yet
            assert probes.registered(agent.plugin) == (False, "registration socket not serving")
            assert agent.sockets is not None and agent.sockets.registration.registered
            release.set()
            starting.join(30)
            assert agent.http is not None and agent.plugin is not None
            # The kubelet's early confirmation counts: ready once everything runs.
            assert _status(f"{agent.http.url}/readyz") == 200
    finally:
        release.set()
        starting.join(30)
        agent.shutdown()
    assert not (short / "k" / "plugins_registry" / f"{DRIVER}-reg.sock").exists()


@pytest.fixture
def node() -> Iterator[tuple[NodeDirs, str]]:
    root = Path(tempfile.mkdtemp(prefix="ef", dir="/tmp"))
    try:
        with FakeAPIServer() as server:
            server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            yield NodeDirs(root), str(server.write_kubeconfig(root / "kubeconfig"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(dirs: NodeDirs, *args: str) -> subprocess.CompletedProcess[str]:
    dirs.set_boot_id("boot-1")
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--node-name", NODE,
         "--kubelet-dir", str(dirs.kubelet), "--cdi-dir", str(dirs.cdi),
         "--metrics-address", "127.0.0.1:0", "--boot-id-file", str(dirs.boot_id), *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "line"), [
    (("--simulate", "no-such-profile", "--kubeconfig", "none"),
     r"error: --simulate: unknown profile 'no-such-profile'; known: .*dgx-h100.*"),
    (("--simulate", "dgx-h100", "--kubeconfig", "/nonexistent/kubeconfig"),
     r"error: cannot build a Kubernetes client from kubeconfig /nonexistent/kubeconfig: "
     r"file not found"),
])
def test_a_start_that_fails_after_the_sockets_is_one_line_and_removes_them(
        node: tuple[NodeDirs, str], args: tuple[str, ...], line: str) -> None:
    dirs, _ = node
    done = _run(dirs, *args)
    assert done.returncode == 1, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if not ln.startswith("time=")]
    assert len(errors) == 1 and re.fullmatch(line, errors[0]), done.stderr
    assert "Traceback" not in done.stderr
    assert not list(dirs.kubelet.rglob("*.sock"))  # both sockets gone
    assert not list(dirs.kubelet.rglob(".s"))  # nor a half-bound one


def test_a_running_agent_never_loads_asyncio_or_grpc_aio(node: tuple[NodeDirs, str]) -> None:
    dirs, kubeconfig = node
    with KubeletStandIn(dirs.registry, poll_interval=0.01) as kubelet:
        agent = AgentProcess(dirs, kubeconfig, env={"PYTHONPROFILEIMPORTTIME": "1"})
        try:
            kubelet.wait_registered(DRIVER, timeout=60)
            agent.wait_http("/readyz", timeout=60)
            wait_for(lambda: "agent ready" in agent.logs(), timeout=30, what="agent ready")
            logs = agent.logs()
        finally:
            assert agent.terminate() == 0
    # A lazy module's import is logged as it is made; its code, and so its own imports
    # (asyncio.events, grpc.aio._channel), only at a first use, which never came.
    imported = {m.group(1) for m in re.finditer(r"^import time:.*\|\s*(\S+)$", logs, re.M)}
    assert {"asyncio", "grpc.aio"} <= imported
    assert not {m for m in imported if m.startswith(("asyncio.", "grpc.aio."))}


def test_a_stop_while_the_rest_loads_is_a_clean_stop(node: tuple[NodeDirs, str]) -> None:
    dirs, kubeconfig = node
    agent = AgentProcess(dirs, kubeconfig)
    registration = dirs.registry / f"{DRIVER}-reg.sock"
    wait_for(registration.exists, timeout=30, interval=0.005, what="the registration socket")
    assert agent.terminate() == 0, agent.logs()  # served, the daemon still loading or starting
    assert "Traceback" not in agent.logs() and "error" not in agent.logs()
    assert not list(dirs.kubelet.rglob("*.sock"))
