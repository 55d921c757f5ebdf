"""`dra-agent run` as a real process: simulated hardware, the fake API server, the kubelet
stand-in, systemd notify and the health endpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn
from tests.ports import free_port

DRIVER = "dra-agent.io"
NODE = "node-e2e"


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short: unix socket paths must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="d", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def apiserver(workdir: Path) -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


class Agent:
    def __init__(self, workdir: Path, kubeconfig: str, *extra: str,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.kubelet_dir = workdir / "kubelet"
        self.cdi_dir = workdir / "cdi"
        self.log = workdir / f"agent-{self.port}.log"
        args = [
            sys.executable, "-m", "agent.cli", "run", "--simulate", "dgx-h100",
            "--node-name", NODE, "--kubeconfig", kubeconfig,
            "--kubelet-dir", str(self.kubelet_dir), "--cdi-dir", str(self.cdi_dir),
            "--metrics-address", f"127.0.0.1:{self.port}", *extra,
        ]
        full_env = {**os.environ, **(env or {})}
        full_env.pop("NOTIFY_SOCKET", None) if "NOTIFY_SOCKET" not in (env or {}) else None
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=full_env)

    def url(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_http(self, path: str, status: int = 200, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        last: tuple[int, str] | None = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"agent exited early:\n{self.log.read_text()}"
            try:
                last = self.url(path)
                if last[0] == status:
                    return last[1]
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{path} never answered {status} (last {last}):\n{self.logs()}")

    def logs(self) -> str:
        return self.log.read_text()

    def terminate(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def test_run_publishes_registers_and_stops_cleanly(workdir: Path, apiserver: FakeAPIServer) -> None:
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    agent = Agent(workdir, str(kubeconfig))
    try:
        with KubeletStandIn(agent.kubelet_dir / "plugins_registry") as kubelet:
            reg = kubelet.wait_registered(DRIVER, timeout=20)
            assert reg.service == "v1.DRAPlugin"
            agent.wait_http("/readyz")
            slices = [s for s in apiserver.list_objects("resourceslices")
                      if s["spec"]["nodeName"] == NODE]
            assert slices, "no ResourceSlice published"
            names = {d["name"] for s in slices for d in s["spec"]["devices"]}
            assert sum(n.startswith("gpu-") for n in names) == 8
            owner = slices[0]["metadata"]["ownerReferences"][0]
            assert owner["kind"] == "Node" and owner["name"] == NODE and owner["controller"]
            status, body = agent.url("/healthz")
            assert status == 200, body
            _, metrics = agent.url("/metrics")
            assert "dra_agent_build_info" in metrics
            assert 'dra_agent_devices{health="healthy",type="gpu"} 8.0' in metrics
        assert agent.terminate() == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    # Sockets removed, slices kept (the kubelet wipes them if we do not come back).
    assert not list((agent.kubelet_dir / "plugins_registry").glob("*.sock"))
    assert not (agent.kubelet_dir / "plugins" / DRIVER / "dra.sock").exists()
    assert apiserver.list_objects("resourceslices")


def test_restart_with_same_hardware_writes_nothing(workdir: Path, apiserver: FakeAPIServer) -> None:
    kubeconfig = str(apiserver.write_kubeconfig(workdir / "kubeconfig"))
    first = Agent(workdir, kubeconfig)
    try:
        # No kubelet confirms the registration here (/readyz waits for that): slices only.
        first.wait_http("/readyz/slices")
    finally:
        assert first.terminate() == 0
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
              for s in apiserver.list_objects("resourceslices")}
    apiserver.clear_requests()
    second = Agent(workdir, kubeconfig)
    try:
        second.wait_http("/readyz/slices")
        time.sleep(1.0)
    finally:
        assert second.terminate() == 0
    writes = [r for r in apiserver.requests
              if r.verb in ("create", "update", "patch", "delete", "deletecollection")
              and r.query.get("dryRun") != "All"]  # the list-attribute probe stores nothing
    assert writes == []
    probes = [r for r in apiserver.requests if r.query.get("dryRun") == "All"]
    assert len(probes) == 1  # numaNode's form is asked once per start
    # The Node is read once: its capacity (the device-plugin check) and its UID (the
    # slices' owner) come from the same GET.
    node_gets = [r for r in apiserver.requests
                 if r.verb == "get" and r.path == f"/api/v1/nodes/{NODE}"]
    assert len(node_gets) == 1, node_gets
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
             for s in apiserver.list_objects("resourceslices")}
    assert after == before


def test_second_agent_on_the_node_fails_fast(workdir: Path) -> None:
    first = Agent(workdir, "none")
    try:
        first.wait_http("/healthz")
        second = Agent(workdir, "none")
        code = second.proc.wait(20)
        assert code != 0
        assert "already" in second.logs().lower(), second.logs()
        # The first one still serves.
        assert first.url("/healthz")[0] == 200
    finally:
        assert first.terminate() == 0


def test_without_api_server_prepare_fails_per_claim_and_unprepare_works(workdir: Path) -> None:
    from tests.fakes.kubelet import ClaimRef

    agent = Agent(workdir, "none")
    try:
        with KubeletStandIn(agent.kubelet_dir / "plugins_registry") as kubelet:
            kubelet.wait_registered(DRIVER, timeout=20)
            ref = ClaimRef("default", "c1", "0b7e2c1e-0000-4000-8000-000000000001")
            result = kubelet.prepare(DRIVER, [ref])[ref.uid]
            assert result.error and "no API server" in result.error
            done = kubelet.unprepare(DRIVER, [ref])[ref.uid]
            assert not done.error
    finally:
        assert agent.terminate() == 0
    assert "no API server" in agent.logs()


def test_systemd_notify_ready_and_stopping(workdir: Path) -> None:
    path = str(workdir / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    # A bound on waiting, not a speed check: start-up took 3 s alone and over 20 s on a
    # 2-CPU machine running other suites beside this one.
    sock.settimeout(90)
    agent = Agent(workdir, "none", env={"NOTIFY_SOCKET": path})
    messages: list[str] = []
    try:
        while not any("READY=1" in m for m in messages):
            messages.append(sock.recv(4096).decode())
        # READY only once the registration socket answers.
        assert list((agent.kubelet_dir / "plugins_registry").glob("*-reg.sock"))
        agent.proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m in messages):
            messages.append(sock.recv(4096).decode())
        assert agent.proc.wait(20) == 0
    finally:
        sock.close()
        if agent.proc.poll() is None:
            agent.proc.kill()
    assert any(m.startswith("STATUS=") or "\nSTATUS=" in m for m in messages)


def test_bad_kubeconfig_is_a_clear_error(workdir: Path) -> None:
    agent = Agent(workdir, str(workdir / "missing-kubeconfig"))
    assert agent.proc.wait(20) == 1
    assert "missing-kubeconfig" in agent.logs()


def test_version_reports_served_apis() -> None:
    out = subprocess.run([sys.executable, "-m", "agent.cli", "version", "-o", "json"],
                         capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    from agent.plugin.registration import DRA_SERVICES, HEALTH_SERVICES

    # What registration advertises, without version importing grpc to say it.
    assert info["kubeletServices"] == list(DRA_SERVICES) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert info["healthServices"] == list(HEALTH_SERVICES)
    assert info["testedKubernetes"] == ["1.37", "1.35"]
    minors = sorted(p.name for p in (REPO / "hack" / "realk8s").glob("v1.*"))
    assert [f"v{m}" for m in sorted(info["testedKubernetes"])] == minors
