"""The one flock helper (agent.common.filelock): what the checkpoint store, the rolling-update
lock, the instance lock and the simulated fault inbox rely on."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.common.filelock import held, lock, open_lock, unlock
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def other_holds(path: Path, *, shared: bool = False) -> bool:
    """Whether a second open of ``path`` (another instance, for flock) cannot take the lock."""
    fd = open_lock(path)
    try:
        return not lock(fd, shared=shared, wait_s=0)
    finally:
        os.close(fd)


def test_an_exclusive_lock_excludes_another_instance_until_it_is_let_go(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    fd = open_lock(path)
    try:
        assert lock(fd) is True
        assert other_holds(path) and other_holds(path, shared=True)
        unlock(fd)
        assert not other_holds(path)
    finally:
        os.close(fd)


def test_shared_locks_coexist_and_keep_an_exclusive_one_out(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    fd = open_lock(path)
    try:
        assert lock(fd, shared=True, wait_s=0)
        assert not other_holds(path, shared=True)
        assert other_holds(path)
    finally:
        os.close(fd)


def test_a_missing_lock_file_is_made_0600_with_the_umask_open(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        os.close(open_lock(tmp_path / "a.lock"))
    finally:
        os.umask(old)
    assert (tmp_path / "a.lock").stat().st_mode & 0o777 == 0o600


def test_a_wait_gives_up_once_it_has_passed(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    with held(path):
        fd = open_lock(path)
        try:
            start = time.monotonic()
            assert lock(fd, wait_s=0.1) is False
            assert time.monotonic() - start >= 0.1
        finally:
            os.close(fd)


def test_a_wait_ends_at_once_when_stop_is_set(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    stop = threading.Event()
    with held(path):
        fd = open_lock(path)
        try:
            threading.Timer(0.05, stop.set).start()
            start = time.monotonic()
            assert lock(fd, shared=True, wait_s=30, stop=stop) is False
            assert time.monotonic() - start < 10
        finally:
            os.close(fd)


def test_a_wait_takes_the_lock_as_soon_as_it_is_let_go(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    holder = open_lock(path)
    lock(holder)
    threading.Timer(0.05, lambda: os.close(holder)).start()
    with held(path, wait_s=30) as had:
        assert had is True


def test_a_blocking_lock_waits_for_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    had = threading.Event()

    def take() -> None:
        with held(path):
            had.set()

    holder = open_lock(path)
    try:
        lock(holder)
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert not had.wait(0.1)  # blocked behind the holder
    finally:
        os.close(holder)  # lets go
    assert had.wait(10)
    thread.join(timeout=10)


def test_held_lets_go_after_the_block_even_when_it_raises(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    with pytest.raises(RuntimeError), held(path):
        assert other_holds(path)
        raise RuntimeError("boom")
    assert not other_holds(path)


@pytest.mark.parametrize("kind", ["dangling-symlink", "symlink-to-file"])
def test_a_symlink_at_the_lock_path_is_never_followed_nor_its_target_made(
    tmp_path: Path, kind: str,
) -> None:
    path, target = tmp_path / "a.lock", tmp_path / "target"
    if kind == "symlink-to-file":
        target.write_text("precious")
    path.symlink_to(target)
    for create in (True, False):
        with pytest.raises(OSError) as info:
            open_lock(path, create=create)
        assert info.value.errno == errno.ELOOP
    if kind == "symlink-to-file":
        assert target.read_text() == "precious"
    else:
        assert not target.exists()


def test_a_fifo_at_the_lock_path_never_blocks_the_open(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    os.mkfifo(path)
    opened: list[int] = []
    for create in (True, False):
        thread = threading.Thread(target=lambda c=create: opened.append(open_lock(path, create=c)),
                                  daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), "open_lock blocked on a FIFO"
    for fd in opened:
        os.close(fd)
    assert len(opened) == 2


def test_an_existing_lock_is_only_looked_at_and_a_missing_one_is_not_made(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.lock"
    with pytest.raises(FileNotFoundError):
        open_lock(path, create=False)
    assert not path.exists()
    path.write_text("")
    path.chmod(0o400)  # read-only is enough to lock it
    fd, other = open_lock(path, create=False), open_lock(path, create=False)
    try:
        assert lock(fd, wait_s=0)
        assert not lock(other, shared=True, wait_s=0)
    finally:
        os.close(fd)
        os.close(other)


def test_the_lock_goes_when_its_holder_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    held_file = tmp_path / "held"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom pathlib import Path\n"
         "from agent.common.filelock import lock, open_lock\n"
         "lock(open_lock(Path(sys.argv[1])))\nPath(sys.argv[2]).write_text('')\n"
         "time.sleep(60)\n", str(path), str(held_file)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(held_file.exists, what="the child to take the lock")
        assert other_holds(path)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert not other_holds(path)
    finally:
        child.kill()
        child.wait(timeout=10)
