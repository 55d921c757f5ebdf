"""Sockets owner-only from the moment they exist, whatever the umask; the instance lock never
follows a link nor writes a file that is not its own."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.plugin.sockets import InstanceLock, SocketError
from tests.plugnode import DRIVER, build_node


def _reachable_by_others(path: Path) -> bool:
    """Another user could connect: the socket grants them write and its directory search."""
    sock = os.stat(path).st_mode
    parent = os.stat(path.parent).st_mode
    return bool(sock & 0o022) and bool(parent & 0o011)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def test_sockets_are_never_reachable_by_others_even_at_bind(
    short_root: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool]] = []
    real_server = grpc.server

    def server(*args: Any, **kwargs: Any) -> Any:
        srv = real_server(*args, **kwargs)
        real_add = srv.add_insecure_port

        def add_insecure_port(address: str) -> int:
            port: int = real_add(address)
            path = Path(address.removeprefix("unix://"))
            seen.append((path.name, _reachable_by_others(path)))  # the instant after bind
            return port

        srv.add_insecure_port = add_insecure_port
        return srv

    monkeypatch.setattr(grpc, "server", server)
    node = build_node(short_root)
    try:
        assert len(seen) == 2 and not any(reachable for _, reachable in seen), seen
        for path in (node.server.paths.dra, node.server.paths.registration):
            mode = os.stat(path).st_mode
            assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o600
        # Nothing left behind in either directory but the sockets (and the lock).
        assert sorted(p.name for p in node.server.paths.registration.parent.iterdir()) == [
            f"{DRIVER}-reg.sock"]
        claim_dir = sorted(p.name for p in node.server.paths.dra.parent.iterdir())
        assert not [n for n in claim_dir if n.startswith(".")], claim_dir
    finally:
        node.kubelet.stop()
        node.server.stop(0)


def test_instance_lock_refuses_a_symlink_and_leaves_its_target_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "instance.lock").symlink_to(victim)
    with pytest.raises(SocketError, match="is a symbolic link; refusing"):
        InstanceLock(tmp_path / "instance.lock").acquire()
    assert victim.read_text() == "precious\n"


def test_instance_lock_refuses_a_hard_link_and_a_fifo(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text("precious\n")
    os.link(other, tmp_path / "instance.lock")
    with pytest.raises(SocketError, match="2 hard links"):
        InstanceLock(tmp_path / "instance.lock").acquire()
    assert other.read_text() == "precious\n"
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(SocketError, match="not a regular file"):
        InstanceLock(tmp_path / "fifo.lock").acquire()


def test_instance_lock_is_written_in_place_never_truncated(tmp_path: Path) -> None:
    path = tmp_path / "instance.lock"
    path.write_text("x" * 100 + "\n")  # whatever was there: the pid goes over its start
    lock = InstanceLock(path)
    lock.acquire()
    try:
        assert path.stat().st_size == 101
        assert path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(SocketError, match=f"pid {os.getpid()}"):
            InstanceLock(path).acquire()
    finally:
        lock.release()
