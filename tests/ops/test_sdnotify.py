"""sd_notify against real datagram sockets, as systemd's manager end receives them."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sdnotify import Notifier, NotifyError, watchdog_interval


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"dra-agent-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    yield sock, "@" + name
    sock.close()


def _messages(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().splitlines()


def test_ready_status_and_stopping_reach_a_path_socket(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("registered with kubelet")
    assert _messages(sock) == ["READY=1", "STATUS=registered with kubelet"]
    assert n.status("publishing 16 devices")
    assert _messages(sock) == ["STATUS=publishing 16 devices"]
    assert n.stopping()
    assert _messages(sock) == ["STOPPING=1"]
    assert n.extend_timeout(2.5)
    assert _messages(sock) == ["EXTEND_TIMEOUT_USEC=2500000"]
    n.close()


def test_abstract_socket_name_gets_a_leading_nul(
    abstract_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = abstract_receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": address})
    assert n.watchdog()
    assert _messages(sock) == ["WATCHDOG=1"]


def test_newlines_in_status_cannot_inject_assignments(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier(path)
    n.status("boom\nREADY=1")
    assert _messages(sock) == ["STATUS=boom READY=1"]


def test_without_notify_socket_everything_is_a_quiet_no_op() -> None:
    n = Notifier.from_env({})
    assert not n.enabled
    assert not n.ready()
    assert not n.watchdog()
    assert n.run_watchdog(threading.Event(), environ={"WATCHDOG_USEC": "1000"}) is None


@pytest.mark.parametrize("bad", ["relative/path", "@", "vsock:2:1234", "/" + "x" * 120])
def test_unusable_addresses_are_rejected_with_the_address(bad: str) -> None:
    with pytest.raises(NotifyError) as err:
        Notifier(bad)
    assert err.value.address == bad
    # from_env degrades to disabled instead of failing the agent
    assert not Notifier.from_env({"NOTIFY_SOCKET": bad}).enabled


def test_send_to_a_vanished_socket_fails_softly(tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "gone.sock"))
    assert n.enabled
    assert not n.ready()
    assert not n.ready()  # still no exception on repeat


def test_watchdog_interval_follows_sd_watchdog_enabled() -> None:
    me = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "-5"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({}) is None


def test_watchdog_thread_pings_while_healthy_and_stops_on_event(
    receiver: tuple[socket.socket, str],
) -> None:
    sock, path = receiver
    n = Notifier(path)
    stop = threading.Event()
    thread = n.run_watchdog(stop, environ={"WATCHDOG_USEC": "20000"})  # ping every 10 ms
    assert thread is not None
    assert _messages(sock) == ["WATCHDOG=1"]
    assert _messages(sock) == ["WATCHDOG=1"]
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_watchdog_withholds_pings_while_unhealthy(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier(path)
    healthy = threading.Event()
    calls = threading.Semaphore(0)

    def check() -> bool:
        calls.release()
        return healthy.is_set()

    stop = threading.Event()
    thread = n.run_watchdog(stop, check, environ={"WATCHDOG_USEC": "20000"})
    assert thread is not None
    for _ in range(3):  # three unhealthy rounds: nothing may arrive
        assert calls.acquire(timeout=5)
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)
    sock.settimeout(5)
    healthy.set()
    assert _messages(sock) == ["WATCHDOG=1"]
    stop.set()
    thread.join(timeout=5)


def test_watchdog_survives_a_raising_health_check(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier(path)
    rounds = iter([RuntimeError("nvml gone"), True, True, True, True])

    def check() -> bool:
        item = next(rounds, True)
        if isinstance(item, Exception):
            raise item
        return item

    stop = threading.Event()
    thread = n.run_watchdog(stop, check, environ={"WATCHDOG_USEC": "20000"})
    assert thread is not None
    assert _messages(sock) == ["WATCHDOG=1"]
    stop.set()
    thread.join(timeout=5)
