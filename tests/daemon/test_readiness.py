"""/readyz's "registered" check passes only once the kubelet has confirmed the registration.

A rolling update stops the old agent Pod as soon as the new one is Ready; a new one Ready on
its sockets alone left the node without the driver until the kubelet's plugin watcher caught
up (FailedPrepareDynamicResources: driver not registered). The confirmation comes through the
real registration gRPC here: the kubelet stand-in, or NotifyRegistrationStatus called by hand.
/healthz never depends on it: a kubelet that is down must not get the agent restarted.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.common.config import Config
from agent.daemon import Daemon, RunOptions
from agent.doctor import selfcheck
from agent.doctor.context import Context, Options
from agent.doctor.host import HostRoot
from agent.doctor.model import Status
from agent.plugin.registration import RegistrationServer, RegistrationStatus
from protos.pluginregistration import api_pb2, api_pb2_grpc
from tests.fakes.kubelet import KubeletStandIn
from tests.waiting import wait_for

DRIVER = "dra-agent.io"
NODE = "node-r"
UNCONFIRMED = "sockets serving, the kubelet has not confirmed the registration yet"


class _Recorder:
    """A notifier that keeps what it was told (the daemon's calls only)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.enabled = True

    def ready(self, status: str | None = None) -> bool:
        self.sent.append({"READY": 1, "STATUS": status})
        return True

    def status(self, text: str) -> bool:
        self.sent.append({"STATUS": text})
        return True

    def stopping(self, status: str | None = None) -> bool:
        self.sent.append({"STOPPING": 1, "STATUS": status})
        return True

    def run_watchdog(self, *_args: Any) -> None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def short() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _daemon(short: Path, notifier: _Recorder | None = None, **run: Any) -> Daemon:
    """An agent without an API server (slices trivially ready) and without a kubelet."""
    cfg = Config(driver_name=DRIVER, node_name=NODE, kubeconfig="none",
                 kubelet_dir=short / "k", cdi_dir=short / "cdi", simulate="dgx-h100",
                 metrics_address="127.0.0.1:0")
    return Daemon(cfg, RunOptions(health=None, slow_rescan_s=3600, **run),
                  notifier=notifier, environ={})  # type: ignore[arg-type]


@pytest.fixture
def daemon(short: Path) -> Iterator[Daemon]:
    agent = _daemon(short)
    agent.start()
    try:
        yield agent
    finally:
        agent.shutdown()


def get(daemon: Daemon, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{daemon.http.url}{path}", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def registered_line(daemon: Daemon) -> str:
    _, body = get(daemon, "/readyz")
    [line] = [ln for ln in body.splitlines() if "registered" in ln.split(" ")[0]]
    return line


def notify(daemon: Daemon, registered: bool, error: str = "") -> None:
    """What the kubelet's plugin watcher does: GetInfo, then NotifyRegistrationStatus."""
    with grpc.insecure_channel(f"unix://{daemon.plugin.paths.registration}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        info = stub.GetInfo(api_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name) == ("DRAPlugin", DRIVER)
        stub.NotifyRegistrationStatus(
            api_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=5)


def test_not_ready_until_the_kubelet_confirms(daemon: Daemon, short: Path) -> None:
    # Both sockets serve, yet no kubelet has registered the plugin: not ready, but alive.
    assert daemon.plugin.paths.registration.is_socket() and daemon.plugin.paths.dra.is_socket()
    status, body = get(daemon, "/readyz")
    assert status == 503, body
    assert registered_line(daemon) == f"[-]registered failed: {UNCONFIRMED}"
    assert "[+]slices ok" in body and "[+]plugin ok" in body
    assert get(daemon, "/healthz")[0] == 200
    assert get(daemon, "/readyz/registered")[0] == 503
    with KubeletStandIn(short / "k" / "plugins_registry") as kubelet:
        kubelet.wait_registered(DRIVER, timeout=10)
        # The stand-in publishes a registration once the plugin has taken the notice.
        status, body = get(daemon, "/readyz")
        assert status == 200, body
        assert registered_line(daemon) == "[+]registered ok: registered with the kubelet"
        assert get(daemon, "/healthz")[0] == 200


def test_a_refused_registration_is_not_ready_and_a_retry_on_the_socket_is(
    daemon: Daemon,
) -> None:
    registration = daemon.plugin.registration
    registration.retry_delay_s = 60.0  # the refusal stands while the test looks
    notify(daemon, False, "endpoint already registered")
    status, body = get(daemon, "/readyz")
    assert status == 503, body
    assert registered_line(daemon) == (
        "[-]registered failed: sockets serving, the kubelet refused the registration "
        "(endpoint already registered); the socket is recreated")
    assert get(daemon, "/healthz")[0] == 200  # a refusing kubelet restarts nothing
    # A 1.36+ kubelet retries on the same socket by itself: its confirmation stands, and the
    # watchdog no longer replaces the socket it registered.
    notify(daemon, True)
    assert get(daemon, "/readyz")[0] == 200
    assert registration.recreations == 0 and registration.alive()
    # Lost again (a restarted kubelet refusing it): not ready until confirmed anew.
    notify(daemon, False, "plugin validation failed")
    assert "refused the registration (plugin validation failed)" in registered_line(daemon)
    assert get(daemon, "/healthz")[0] == 200


def test_a_recreated_socket_is_not_ready_until_confirmed_again(short: Path) -> None:
    agent = _daemon(short, registration_timeout_s=30.0)
    agent.start()
    try:
        registration = agent.plugin.registration
        registration.retry_delay_s = 0.05
        notify(agent, True)
        assert get(agent, "/readyz")[0] == 200
        notify(agent, False, "kubelet restarted")  # the watchdog replaces the socket
        wait_for(lambda: registration.recreations == 1 and registration.status is None
                 and agent.plugin.paths.registration.is_socket())
        assert registered_line(agent) == f"[-]registered failed: {UNCONFIRMED}"
        notify(agent, True)
        assert get(agent, "/readyz")[0] == 200
    finally:
        agent.shutdown()


def test_a_notice_for_a_replaced_socket_is_ignored(short: Path) -> None:
    """A notice still being handled on the socket the watchdog replaced (the kubelet is about
    to drop that registration) must neither make the new socket ready nor stop the watchdog
    from replacing a new socket the kubelet never registers."""
    path = short / "x-reg.sock"
    registration = RegistrationServer(path, DRIVER, short / "dra.sock", timeout_s=0.2)
    registration.start()
    try:
        wait_for(lambda: registration.recreations >= 1)
        registration.notified(RegistrationStatus(True, ""), generation=0)  # the first socket
        assert registration.status is None and not registration.registered
        before = registration.recreations
        wait_for(lambda: registration.recreations > before)  # the watchdog carries on
        registration.notified(RegistrationStatus(True, ""))  # the current one's notice
        assert registration.registered
    finally:
        registration.stop()


def test_systemd_ready_at_sockets_status_and_log_follow_the_kubelet(
    short: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """READY=1 does not wait for a kubelet (a late one would fail the unit's start and hold
    up what is ordered after it); STATUS= and the "agent ready" log line do."""
    caplog.set_level(logging.INFO, logger="agent.daemon")
    notifier = _Recorder()
    agent = _daemon(short, notifier)
    agent.start()
    runner = threading.Thread(target=agent.run_until_stopped, daemon=True)
    runner.start()
    try:
        [ready] = [m for m in notifier.sent if m.get("READY")]
        assert ready["STATUS"].startswith("waiting for the kubelet; serving 20 devices")
        assert not [r for r in caplog.records if r.getMessage() == "agent ready"]
        [waiting] = [r for r in caplog.records if "not ready until" in r.getMessage()]
        assert waiting.getMessage() == \
            "agent serving; not ready until the kubelet confirms the registration"
        with KubeletStandIn(short / "k" / "plugins_registry") as kubelet:
            kubelet.wait_registered(DRIVER, timeout=10)
            wait_for(lambda: any(r.getMessage() == "agent ready" for r in caplog.records))
            wait_for(lambda: any(str(m.get("STATUS", "")).startswith(
                "registered with the kubelet; serving 20 devices") for m in notifier.sent))
    finally:
        agent.request_stop("test")
        runner.join(20)
    assert not runner.is_alive()


def test_doctor_names_the_unconfirmed_registration(daemon: Daemon, short: Path) -> None:
    ctx = Context(host=HostRoot(short), options=Options(
        node_name=NODE, metrics_address=f"127.0.0.1:{daemon.http.port}"))
    check = selfcheck.check_health(ctx, timeout_s=5)
    assert check.status is Status.WARN, check
    assert check.found.endswith(f"/readyz answers 503: [-]registered failed: {UNCONFIRMED}")
