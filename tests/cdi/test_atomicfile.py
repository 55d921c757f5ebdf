"""The one atomic durable writer (cdi.atomicfile), through its FileOps seam: what every caller
(CDI specs, the checkpoint, the device metadata files) relies on."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from cdi.atomicfile import (
    AtomicWriteError,
    OsFileOps,
    Step,
    fsync_dir,
    volatile_fs,
    write_atomic,
)


class RecordingOps(OsFileOps):
    """Real system calls, recorded; the one named ``fail`` raises ``error`` instead (the
    open and fsync of a directory, one of ``dirs``, count as ``dir-open`` and ``dir-fsync``)."""

    def __init__(self, fail: str = "", error: int = errno.ENOSPC, chunk: int = 0) -> None:
        self.fail, self.error, self.chunk = fail, error, chunk
        self.calls: list[str] = []
        self.dirs: set[int] = set()  # descriptors of directories

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise OSError(self.error, os.strerror(self.error))

    def open(self, path: str, flags: int, mode: int = 0o777, *,
             dir_fd: int | None = None) -> int:
        is_dir = bool(flags & os.O_DIRECTORY)
        self._call("dir-open" if is_dir else "open")
        fd = super().open(path, flags, mode, dir_fd=dir_fd)
        if is_dir:
            self.dirs.add(fd)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._call("write")
        return super().write(fd, data[: self.chunk] if self.chunk else data)

    def fsync(self, fd: int) -> None:
        self._call("dir-fsync" if fd in self.dirs else "fsync")
        super().fsync(fd)

    def replace(self, src: str, dst: str, *, src_dir_fd: int | None = None,
                dst_dir_fd: int | None = None) -> None:
        self._call("replace")
        super().replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def test_the_file_is_replaced_by_a_new_one_and_no_temp_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    ino = path.stat().st_ino
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert path.stat().st_ino != ino  # a new file renamed over the old one
    assert os.listdir(tmp_path) == ["state.json"]


def test_durable_syncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path,
) -> None:
    ops = RecordingOps()
    write_atomic(tmp_path / "a.json", b"x", ops=ops)
    assert ops.calls == ["open", "write", "fsync", "replace", "dir-open", "dir-fsync"]


def test_not_durable_syncs_nothing(tmp_path: Path) -> None:
    ops = RecordingOps()
    write_atomic(tmp_path / "a.json", b"x", durable=False, ops=ops)
    assert ops.calls == ["open", "write", "replace"]


def test_without_sync_dir_only_the_file_is_synced_before_the_rename(tmp_path: Path) -> None:
    ops = RecordingOps()
    write_atomic(tmp_path / "a.json", b"x", sync_dir=False, ops=ops)
    assert ops.calls == ["open", "write", "fsync", "replace"]


def _mount_type(path: str) -> str | None:
    """The file system type /proc/self/mounts gives a mount point (the last one mounted)."""
    found = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == path:
            found = fields[2]
    return found


def test_volatile_fs_says_what_the_kernel_says() -> None:
    # /dev/shm is tmpfs on every Linux here; /proc is procfs, which no fsync concerns either
    # way but is no tmpfs; a path that does not exist cannot be told: fsync as on a disk.
    assert volatile_fs("/dev/shm") is (_mount_type("/dev/shm") == "tmpfs")
    assert volatile_fs("/proc") is False
    assert volatile_fs("/no/such/dir") is False
    assert volatile_fs(Path("/dev/shm")) is volatile_fs("/dev/shm")


def test_mode_is_exact_whatever_the_umask_unless_the_caller_lets_the_umask_decide(
    tmp_path: Path,
) -> None:
    old_umask = os.umask(0o077)  # the agent's
    try:
        write_atomic(tmp_path / "exact", b"x", mode=0o644)
        write_atomic(tmp_path / "umask", b"x", mode=0o644, exact_mode=False)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "exact").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "umask").stat().st_mode) == 0o600


def test_short_writes_still_write_everything(tmp_path: Path) -> None:
    data = bytes(range(256)) * 10
    ops = RecordingOps(chunk=7)
    write_atomic(tmp_path / "a.json", data, ops=ops)
    assert (tmp_path / "a.json").read_bytes() == data
    assert ops.calls.count("write") == -(-len(data) // 7)


@pytest.mark.parametrize(("fail", "step"), [
    ("open", "create"), ("write", "write"), ("fsync", "write"), ("replace", "rename")])
def test_a_failure_before_the_rename_names_its_step_and_changes_nothing(
    tmp_path: Path, fail: str, step: Step,
) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"old")
    with pytest.raises(AtomicWriteError) as info:
        write_atomic(path, b"new", ops=RecordingOps(fail, errno.EROFS))
    assert info.value.step == step
    assert info.value.errno == errno.EROFS and info.value.cause.errno == errno.EROFS
    assert isinstance(info.value, OSError)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.json"]  # no temp file


def test_a_failed_directory_sync_is_reported_with_the_new_file_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.json"
    with pytest.raises(AtomicWriteError) as info:
        write_atomic(path, b"new", ops=RecordingOps("dir-fsync", errno.EIO))
    assert info.value.step == "sync-dir"
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_write_that_writes_nothing_is_an_error_not_a_loop(tmp_path: Path) -> None:
    class Stuck(OsFileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            return 0

    with pytest.raises(AtomicWriteError) as info:
        write_atomic(tmp_path / "a.json", b"x", ops=Stuck())
    assert (info.value.step, info.value.errno) == ("write", errno.EIO)
    assert os.listdir(tmp_path) == []


def test_an_interrupt_removes_the_temp_file_and_is_not_wrapped(tmp_path: Path) -> None:
    class Interrupted(OsFileOps):
        def fsync(self, fd: int) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "a.json", b"x", ops=Interrupted())
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["symlink", "dangling-symlink", "fifo"])
def test_whatever_is_planted_at_the_name_is_replaced_never_followed(
    tmp_path: Path, kind: str,
) -> None:
    path = tmp_path / "a.json"
    victim = tmp_path / "victim"
    if kind == "symlink":
        victim.write_text("precious")
        path.symlink_to(victim)
    elif kind == "dangling-symlink":
        path.symlink_to(victim)
    else:
        os.mkfifo(path)
    write_atomic(path, b"new")
    assert not path.is_symlink() and path.read_bytes() == b"new"
    if kind == "symlink":
        assert victim.read_text() == "precious"
    else:
        assert not victim.exists()


def test_a_directory_at_the_name_fails_at_the_rename_and_stays(tmp_path: Path) -> None:
    (tmp_path / "a.json" / "inside").mkdir(parents=True)
    with pytest.raises(AtomicWriteError) as info:
        write_atomic(tmp_path / "a.json", b"x")
    assert info.value.step == "rename"
    assert (tmp_path / "a.json" / "inside").is_dir()
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_missing_directory_fails_at_create(tmp_path: Path) -> None:
    with pytest.raises(AtomicWriteError) as info:
        write_atomic(tmp_path / "missing" / "a.json", b"x")
    assert (info.value.step, info.value.errno) == ("create", errno.ENOENT)


def test_with_dir_fd_the_write_lands_in_the_opened_directory_even_once_its_path_moved(
    tmp_path: Path,
) -> None:
    opened = tmp_path / "opened"
    opened.mkdir()
    fd = os.open(opened, os.O_RDONLY | os.O_DIRECTORY)
    try:
        opened.rename(tmp_path / "moved")
        opened.symlink_to(tmp_path / "elsewhere")  # the path now leads somewhere else
        ops = RecordingOps()
        ops.dirs.add(fd)
        write_atomic(opened / "a.json", b"x", dir_fd=fd, ops=ops)
    finally:
        os.close(fd)
    assert (tmp_path / "moved" / "a.json").read_bytes() == b"x"
    assert not (tmp_path / "elsewhere").exists()
    # The directory is synced through the caller's descriptor: no open of its path.
    assert ops.calls == ["open", "write", "fsync", "replace", "dir-fsync"]


def test_concurrent_writers_never_share_a_temp_name(tmp_path: Path) -> None:
    names: set[str] = set()

    class Recording(OsFileOps):
        def open(self, path: str, flags: int, mode: int = 0o777, *,
                 dir_fd: int | None = None) -> int:
            if not flags & os.O_DIRECTORY:
                name = os.path.basename(path)
                assert name.startswith(".a.json.") and name.endswith(".tmp")
                names.add(name)
            return super().open(path, flags, mode, dir_fd=dir_fd)

    for _ in range(50):
        write_atomic(tmp_path / "a.json", b"x", ops=Recording())
    assert len(names) == 50


def test_fsync_dir_makes_a_removal_durable_through_the_seam(tmp_path: Path) -> None:
    ops = RecordingOps()
    fsync_dir(tmp_path, ops)
    assert ops.calls == ["dir-open", "dir-fsync"]
    with pytest.raises(OSError) as info:
        fsync_dir(tmp_path, RecordingOps("dir-fsync", errno.EIO))
    assert info.value.errno == errno.EIO
