"""Socket paths, owner-only permissions, stale-socket replacement and the instance lock.

Layout (the kubelet root dir is configurable):

* ``<kubelet>/plugins_registry/<driver>-reg.sock`` — registration (watched by the kubelet);
* ``<kubelet>/plugins/<driver>/dra.sock`` — the DRA services (the ``endpoint``);
* rolling-update mode: ``<driver>-<podUID>-reg.sock`` and ``dra-<podUID>.sock`` so the old and
  the new pod never unlink each other's sockets (falling back to a short hash of the pod UID
  when the path would pass the 108-byte AF_UNIX limit);
* ``<plugin dir>/instance.lock`` (normal mode) or ``instance-<podUID>.lock``: held for the
  life of the process, so a second agent on the node fails at once instead of stealing the
  sockets of the running one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from agent.common.filelock import lock, open_lock

#: AF_UNIX ``sun_path`` holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class SocketError(Exception):
    """A socket path that cannot be used; the message says which and why."""


class AlreadyRunningError(SocketError):
    """Another agent instance holds this plugin directory's instance lock."""


@dataclass(frozen=True, slots=True)
class SocketPaths:
    registration: Path
    dra: Path
    plugin_dir: Path
    instance_lock: Path
    serialize_lock: Path


def _short(pod_uid: str) -> str:
    # Lazy: OpenSSL's hashes load only for a rolling update's over-long path.
    import base64
    import hashlib

    digest = hashlib.sha256(pod_uid.encode()).digest()[:8]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def socket_paths(
    kubelet_dir: Path, driver: str, pod_uid: str | None = None, rolling_update: bool = False
) -> SocketPaths:
    """The paths for this instance; raises SocketError when they cannot fit or are unsafe."""
    if not kubelet_dir.is_absolute():
        raise SocketError(f"kubelet dir {kubelet_dir} must be absolute (the kubelet dials it)")
    if "/" in driver or driver.startswith("."):
        raise SocketError(f"driver name {driver!r} cannot be used in a socket file name")
    registry = kubelet_dir / "plugins_registry"
    plugin_dir = kubelet_dir / "plugins" / driver
    if rolling_update:
        if not pod_uid:
            raise SocketError("rolling-update mode needs the pod UID (POD_UID, downward API)")
        candidates = [
            (registry / f"{driver}-{pod_uid}-reg.sock", plugin_dir / f"dra-{pod_uid}.sock"),
            (
                registry / f"{driver}-{_short(pod_uid)}-reg.sock",
                plugin_dir / f"dra-{_short(pod_uid)}.sock",
            ),
        ]
        lock = plugin_dir / f"instance-{pod_uid}.lock"
    else:
        candidates = [(registry / f"{driver}-reg.sock", plugin_dir / "dra.sock")]
        lock = plugin_dir / "instance.lock"
    for reg, dra in candidates:
        if max(len(os.fsencode(reg)), len(os.fsencode(dra))) <= MAX_SOCKET_PATH:
            return SocketPaths(reg, dra, plugin_dir, lock, plugin_dir / "serialize.lock")
    reg, dra = candidates[-1]
    raise SocketError(
        f"socket paths {reg} / {dra} exceed the {MAX_SOCKET_PATH}-byte AF_UNIX limit; "
        "use a shorter --kubelet-dir or driver name"
    )


def prepare_socket_path(path: Path) -> None:
    """Make ``path`` free for a new socket: create the directory, remove a stale socket.

    Only a socket is removed; any other kind of file there is somebody else's and an error.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketError(f"{path} exists and is not a socket; refusing to remove it")
    os.unlink(path)


def bind_unix(server: Any, path: Path) -> None:
    """Bind gRPC ``server`` at ``path``, owner-only (0600) from the socket's first moment.

    gRPC creates the socket file under the process umask and offers no mode; a chmod after
    the bind leaves a window in which anyone may connect, and changing the umask around the
    bind would race with every other thread creating files. So the socket is bound in a fresh
    directory only this user can enter (0700), made 0600 there, and renamed into place:
    rename keeps the listening socket, is atomic, and replaces a stale socket at ``path``.
    The directory and the socket in it start with "." (the kubelet's plugin watcher ignores
    such names) and together are no longer than ``/dra.sock``, so the 108-byte limit that
    ``socket_paths`` checked still holds.
    """
    prepare_socket_path(path)
    private = _private_dir(path.parent)
    bound = private / ".s"
    try:
        if len(os.fsencode(bound)) > MAX_SOCKET_PATH:
            raise SocketError(f"{path}: the path is too long to bind (AF_UNIX limit)")
        try:
            server.add_insecure_port(f"unix://{bound}")
        except RuntimeError as err:
            raise SocketError(f"cannot listen on {path}: {err}") from err
        os.chmod(bound, 0o600)
        os.rename(bound, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bound)
        os.rmdir(private)


def _private_dir(parent: Path) -> Path:
    for _ in range(16):
        candidate = parent / f".{os.urandom(2).hex()}"  # not a secret: unique, nothing more
        try:
            os.mkdir(candidate, 0o700)  # the umask can only make it tighter
        except FileExistsError:
            continue
        return candidate
    raise SocketError(f"cannot create a private directory in {parent} to bind a socket")


def remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


class InstanceLock:
    """An exclusive, non-blocking flock held for the life of the agent.

    The file is the agent's own: a symlink is never followed (it could point at any file on
    the host) and anything but a regular file with one link, owned by this user, is refused
    rather than written. The pid is written over the start of the file in a fixed width, so
    the file is never truncated.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        if not lock(fd, wait_s=0):
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunningError(
                f"another dra-agent (pid {holder}) already serves {self.path.parent}; "
                "stop it first, or use rolling-update mode with distinct pod UIDs"
            ) from None
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)
        self._fd = fd

    def _open(self) -> int:
        # Looked at before opening too: opening a device node or FIFO can itself act on it.
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(self.path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                self._refuse("is not a regular file")
        try:
            fd = open_lock(self.path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                self._refuse("is a symbolic link")
            raise SocketError(
                f"instance lock {self.path}: cannot open: {err.strerror or err}"
            ) from None
        st = os.fstat(fd)
        why = ""
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_nlink != 1:
            why = f"has {st.st_nlink} hard links (another file shares it)"
        elif st.st_uid != os.geteuid():
            why = f"is owned by uid {st.st_uid}, not this agent's {os.geteuid()}"
        if why:
            os.close(fd)
            self._refuse(why)
        return fd

    def _refuse(self, why: str) -> NoReturn:
        raise SocketError(f"instance lock {self.path} {why}; refusing to use it (remove it)")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
