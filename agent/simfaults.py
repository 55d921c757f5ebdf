"""Simulated device faults from outside the agent's process (``dra-agent simulate fault``).

A ``--simulate`` agent's GPUs are a ``FakeNvml``, whose fault hooks exist only inside its
process. ``FaultInbox`` makes them reachable from outside: the agent watches
``<plugin dir>/simulated-faults/`` (beside the checkpoint and the simulated GPUs' other state;
the DaemonSet mounts that directory, so ``kubectl exec`` into the agent's container reaches it),
and every file there is one request, a JSON object of at most ``MAX_REQUEST_BYTES``::

    {"device": "gpu-3", "fault": "xid", "xid": 79}
    {"device": "gpu-3", "fault": "ecc"}        a double-bit (uncorrectable) ECC error
    {"device": "gpu-3", "fault": "lost"}       the GPU falls off the bus (NVML: GPU_IS_LOST)
    {"device": "gpu-3", "fault": "recover"}    the GPU answers NVML again

``device`` is a published device name: a GPU, or a MIG device (an Xid or ECC error then names
its instance; ``lost`` and ``recover`` act on its whole GPU). The health monitor sees the fault
as it would a real one: the taints that follow are its (``--health-taint-effects``), and an
Xid or ECC error clears by itself once the quiet period passes without another.

While it runs, a simulated agent holds a shared flock on ``<plugin dir>/simulated-faults.lock``
(``agent_problem`` tells a writer whether one does: a lock nobody holds is a simulated agent
gone). The inbox itself is made by its first writer, so an agent nobody sends faults to leaves
nothing but that lock beside its checkpoint.

A request delivered is deleted, with one log line naming the device. One that cannot be (bad
JSON, an unknown device, a NIC, over the size cap, a symlink, a directory, a FIFO) is one
warning line and is moved aside to ``.rejected/``, with ``<name>.reason`` beside it saying why
(the newest ``MAX_REJECTED`` entries are kept). Names starting with a dot are never requests:
the writer's temporary files, ``.rejected``, ``.lock``.

``write_request`` is the writer's side: a temporary file renamed into place, so the agent never
reads half a request. Every poll of the agent holds the inbox's ``.lock`` (flock), so the two
agents of a rolling update never both deliver one request, and a writer that gives up waiting
withdraws its request without racing a delivery (``withdraw``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from agent.common.k8snames import dns_label_problem
from agent.common.safefile import UnsafeFileError, read_capped

if TYPE_CHECKING:
    from agent.health.options import HealthOptions
    from discovery.gpulib import GpuLibrary
    from discovery.model import Device, Inventory

log = logging.getLogger("agent.simfaults")

#: The inbox, under the agent's plugin directory (``Config.simulated_faults_dir``).
INBOX_SUBDIR = "simulated-faults"
#: Beside the inbox: the lock a running simulated agent holds (shared) for its life.
AGENT_LOCK_SUFFIX = ".lock"
#: Where refused requests go, inside the inbox, each with ``<name>.reason``.
REJECTED_SUBDIR = ".rejected"
REASON_SUFFIX = ".reason"
LOCK_NAME = ".lock"
#: A request is a line of JSON; anything bigger is not one.
MAX_REQUEST_BYTES = 4096
#: Refused entries kept in ``.rejected`` (requests and reason files together).
MAX_REJECTED = 64
#: Requests taken per poll, so a flooded inbox never holds the lock for long.
MAX_PER_POLL = 64
#: NVML reports an Xid as an unsigned number; real ones are below 200.
MAX_XID = 0xFFFF_FFFF
#: How often the agent looks into its inbox.
POLL_S = 0.2
_KEYS = frozenset({"device", "fault", "xid"})


class FaultKind(StrEnum):
    XID = "xid"
    ECC = "ecc"
    LOST = "lost"
    RECOVER = "recover"


class FaultRequestError(ValueError):
    """A request that cannot be delivered; the message says why, for the log and the writer."""


def printable(text: str, limit: int = 120) -> str:
    """``text`` safe on one log or terminal line: non-printable characters (newline, escape,
    an undecodable byte of a file name) become ``?``, cut to ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _shown(value: object) -> str:
    return printable(json.dumps(value) if not isinstance(value, str) else repr(value), 60)


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """One fault for one published device."""

    device: str
    fault: FaultKind
    xid: int | None = None

    def __post_init__(self) -> None:
        problem = dns_label_problem(self.device)
        if problem is not None:
            raise FaultRequestError(f"device {_shown(self.device)}: {problem}")
        if self.fault is FaultKind.XID:
            if isinstance(self.xid, bool) or not isinstance(self.xid, int) \
                    or not 1 <= self.xid <= MAX_XID:
                raise FaultRequestError(
                    f"xid must be a number from 1 to {MAX_XID}, not {_shown(self.xid)}")
        elif self.xid is not None:
            raise FaultRequestError(f"xid is only for the fault xid, not {self.fault}")

    def to_json(self) -> bytes:
        doc: dict[str, object] = {"device": self.device, "fault": str(self.fault)}
        if self.xid is not None:
            doc["xid"] = self.xid
        return (json.dumps(doc) + "\n").encode()

    def describe(self) -> str:
        """``Xid 79``, ``double-bit ECC error``, ``lost``, ``recover``."""
        if self.fault is FaultKind.XID:
            return f"Xid {self.xid}"
        if self.fault is FaultKind.ECC:
            return "double-bit ECC error"
        return str(self.fault)


def parse_request(raw: bytes) -> FaultRequest:
    """The request in a file's bytes; ``FaultRequestError`` says what is wrong with them."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FaultRequestError(f"not UTF-8 text (byte at offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise FaultRequestError(f"not JSON: {err.msg} at line {err.lineno} column {err.colno}") \
            from None
    except RecursionError:
        raise FaultRequestError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise FaultRequestError(
            'not a JSON object like {"device": "gpu-3", "fault": "xid", "xid": 79}')
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise FaultRequestError(f"unknown key(s) {', '.join(_shown(k) for k in unknown[:5])}; "
                                f"known: {', '.join(sorted(_KEYS))}")
    device, fault = doc.get("device"), doc.get("fault")
    if not isinstance(device, str):
        raise FaultRequestError(f"device must be a device name like \"gpu-3\", not "
                                f"{_shown(device)}")
    if not isinstance(fault, str) or fault not in set(FaultKind):
        raise FaultRequestError(f"fault {_shown(fault)} is not one of "
                                f"{', '.join(k.value for k in FaultKind)}")
    return FaultRequest(device, FaultKind(fault), doc.get("xid"))


# -- the writer's side ---------------------------------------------------------------------------


def agent_lock_path(inbox: Path) -> Path:
    """``<plugin dir>/simulated-faults.lock``, held by every running simulated agent."""
    return inbox.with_name(inbox.name + AGENT_LOCK_SUFFIX)


def agent_problem(inbox: Path) -> str | None:
    """Why no simulated agent takes requests from ``inbox`` (None: one runs). Its lock is
    tried exclusively and let go at once; an agent holds it shared, so this fails while one
    runs, and an agent starting meanwhile waits the moment out."""
    lock = agent_lock_path(inbox)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{lock} does not exist: no 'dra-agent run --simulate' ran here"
    except OSError as err:
        return f"cannot open {lock}: {err.strerror or err}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{lock} is not a regular file"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # held: an agent runs
        return f"no running agent holds {lock}: the 'dra-agent run --simulate' here stopped"
    finally:
        os.close(fd)


def open_inbox(inbox: Path) -> None:
    """Make the inbox if it is not there yet; ``OSError`` when it cannot be, or when something
    other than a directory (a symlink: never followed) is at its name."""
    with contextlib.suppress(FileExistsError):
        inbox.mkdir(mode=0o700)
    if not stat.S_ISDIR(os.lstat(inbox).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory (a symlink is never followed)",
                                 str(inbox))


def write_request(inbox: Path, request: FaultRequest) -> str:
    """Leave ``request`` in ``inbox`` (a temporary dot-file renamed into place); its name.

    Names sort in the order they were written (nanoseconds first), which the agent keeps."""
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}.json"
    tmp = inbox / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(request.to_json())
        os.rename(tmp, inbox / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return name


class Outcome(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    REFUSED = "refused"


def outcome(inbox: Path, name: str) -> tuple[Outcome, str]:
    """What became of the request ``name``, and the agent's reason when it refused it. The
    agent writes the reason before it moves the request, so a request gone without one was
    delivered."""
    if os.path.lexists(inbox / name):
        return Outcome.PENDING, ""
    rejected = inbox / REJECTED_SUBDIR
    try:
        reason = read_capped(rejected / (name + REASON_SUFFIX), MAX_REQUEST_BYTES)
    except FileNotFoundError:
        if os.path.lexists(rejected / name):
            return Outcome.REFUSED, "its reason is in the agent's log"
        return Outcome.DELIVERED, ""
    except (OSError, UnsafeFileError):
        return Outcome.REFUSED, "its reason is in the agent's log"
    return Outcome.REFUSED, printable(" ".join(reason.decode(errors="replace").split()), 500)


@contextlib.contextmanager
def inbox_lock(inbox: Path, wait_s: float = 0.0) -> Iterator[bool]:
    """Hold the inbox's flock while the block runs; yields whether it was had within
    ``wait_s`` (False too when the lock file cannot be opened: a symlink, no permission)."""
    try:
        fd = os.open(inbox / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + wait_s
        locked = False
        while not locked:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
        yield locked
    finally:
        os.close(fd)  # releases the lock


def withdraw(inbox: Path, name: str) -> bool:
    """Take back a request the agent has not taken; False when it was taken meanwhile."""
    with inbox_lock(inbox, wait_s=2.0):
        try:
            os.unlink(inbox / name)
        except FileNotFoundError:
            return False
    return True


# -- the agent's side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a request will do, decided (and refused, if it must be) before it is consumed."""

    action: Callable[[], None]
    fields: Mapping[str, str] = field(default_factory=dict)


def _remove(path: Path) -> None:
    """Remove whatever is at ``path``, a directory with what it holds (symlinks not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _write_reason(path: Path, reason: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    _remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
        out.write(reason + "\n")
    _remove(path)
    os.rename(tmp, path)


class FaultInbox:
    """The agent's end: one thread (``start``) taking requests until ``stop`` is set.

    ``gpu`` is the agent's GPU library; requests are refused unless it is a ``FakeNvml``.
    ``health`` is the agent's health options (None: monitoring is off, so requests are refused:
    nothing would see the fault)."""

    def __init__(self, directory: Path, gpu: GpuLibrary | None,
                 inventory: Callable[[], Inventory], *, health: HealthOptions | None,
                 stop: threading.Event, poll_s: float = POLL_S) -> None:
        from discovery.simulate.fake_nvml import FakeNvml

        self.directory = directory
        self._nvml = gpu if isinstance(gpu, FakeNvml) else None
        self._inventory = inventory
        self._health = health
        self._stop = stop
        self.poll_s = poll_s
        #: Why the inbox could not be read at the last poll (said once, until it can again).
        self._unusable: str | None = None

    def start(self) -> threading.Thread | None:
        """Take the agent's lock and start the thread; None (with a warning) without it."""
        lock = agent_lock_path(self.directory)
        try:
            lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
        except OSError as err:
            log.warning("simulated faults unavailable: cannot open the agent's lock",
                        extra={"lock": str(lock), "error": err.strerror or str(err)})
            return None
        if not self._share(fd):
            os.close(fd)
            log.warning("simulated faults unavailable: the agent's lock is held exclusively",
                        extra={"lock": str(lock)})
            return None
        log.info("simulated faults: 'dra-agent simulate fault' delivers here",
                 extra={"directory": str(self.directory)})
        thread = threading.Thread(target=self.run, args=(fd,), name="simulated-faults",
                                  daemon=True)
        thread.start()
        return thread

    def _share(self, fd: int, wait_s: float = 2.0) -> bool:
        """A shared flock on ``fd``, waiting out a writer's probe (``agent_problem``)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline or self._stop.wait(0.01):
                    return False
            except OSError:
                return False

    def run(self, lock_fd: int | None = None) -> None:
        """Poll until stopped, holding ``lock_fd`` (closed at the end). Never ends otherwise:
        the daemon takes a dead thread as fatal."""
        try:
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception as err:
                    log.warning("simulated fault inbox: poll failed",
                                extra={"error": f"{type(err).__name__}: {err}"})
                self._stop.wait(self.poll_s)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    def poll(self) -> int:
        """Take the pending requests (at most ``MAX_PER_POLL``); how many were taken."""
        if not self._usable():
            return 0
        with inbox_lock(self.directory) as locked:
            if not locked:
                return 0  # the other agent of a rolling update is at it (or a writer is)
            with os.scandir(self.directory) as entries:
                names = sorted(e.name for e in entries if not e.name.startswith("."))
            for name in names[:MAX_PER_POLL]:
                self._take(name)
            return min(len(names), MAX_PER_POLL)

    def _usable(self) -> bool:
        """Whether there is an inbox to read: a directory of its own (a symlink there is never
        followed). None yet is normal: its first writer makes it."""
        problem: str | None = None
        missing = False
        try:
            if not stat.S_ISDIR(os.lstat(self.directory).st_mode):
                problem = "is not a directory (a symlink is never followed)"
        except FileNotFoundError:
            missing = True
        except OSError as err:
            problem = f"cannot be read: {err.strerror or err}"
        if problem != self._unusable:
            if problem is not None:
                log.warning("simulated fault inbox unusable",
                            extra={"directory": str(self.directory), "reason": problem})
            elif self._unusable is not None:
                log.info("simulated fault inbox usable again",
                         extra={"directory": str(self.directory)})
            self._unusable = problem
        return problem is None and not missing

    def _take(self, name: str) -> None:
        path = self.directory / name
        try:
            raw = read_capped(path, MAX_REQUEST_BYTES)
            request = parse_request(raw)
            plan = self._plan(request)
        except FileNotFoundError:
            return  # withdrawn by its writer
        except UnsafeFileError as err:
            self._refuse(name, err.reason)
            return
        except OSError as err:
            self._refuse(name, f"cannot be read: {err.strerror or err}")
            return
        except FaultRequestError as err:
            self._refuse(name, str(err))
            return
        try:
            os.unlink(path)  # consumed before it acts: never delivered twice
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning("simulated fault not delivered: the request cannot be removed",
                        extra={"file": printable(name), "device": request.device,
                               "error": err.strerror or str(err)})
            return
        from discovery.gpulib import GpuLibraryError

        try:
            plan.action()
        except GpuLibraryError as err:  # the GPU left the simulation since the plan
            log.warning("simulated fault not delivered", extra={
                "device": request.device, "fault": str(request.fault), "error": str(err)})
            return
        log.info("simulated fault delivered", extra={**plan.fields, "file": printable(name)})

    def _plan(self, request: FaultRequest) -> _Plan:
        from agent.health.gpu import devices_for
        from agent.health.model import Kind
        from discovery.gpulib import WHOLE_GPU
        from discovery.model import DeviceType

        if self._health is None:
            raise FaultRequestError("device health monitoring is off (--no-health): nothing "
                                    "would see the fault")
        nvml = self._nvml
        if nvml is None:
            raise FaultRequestError("this agent's GPUs are not simulated NVIDIA GPUs")
        inventory = self._inventory()
        by_name = inventory.by_name()
        gpus = sorted(n for n, d in by_name.items() if d.type in (DeviceType.GPU, DeviceType.MIG))
        device: Device | None = by_name.get(request.device)
        if device is None:
            raise FaultRequestError(f"no device {request.device} on this node; its GPU and MIG "
                                    f"devices: {_listing(gpus)}")
        if device.type not in (DeviceType.GPU, DeviceType.MIG):
            raise FaultRequestError(f"{request.device} is a {device.type} device: simulated "
                                    f"faults are NVML's, for GPU and MIG devices "
                                    f"({_listing(gpus)})")
        gpu_uuid = device.host.parent_uuid or device.host.uuid
        if gpu_uuid is None:
            raise FaultRequestError(f"{request.device} has no NVIDIA GPU behind it")
        fields = {"device": request.device, "fault": str(request.fault)}
        whole = request.fault in (FaultKind.LOST, FaultKind.RECOVER)
        if whole:
            uuid, gi, ci = gpu_uuid, WHOLE_GPU, WHOLE_GPU
        elif device.host.uuid is None:
            raise FaultRequestError(
                f"{request.device} is a MIG partition without an instance yet (made at "
                f"prepare): an {request.fault} error needs one; name its GPU instead")
        else:
            uuid = device.host.uuid
            gi = device.host.mig_gi if device.host.mig_gi is not None else WHOLE_GPU
            ci = device.host.mig_ci if device.host.mig_ci is not None else WHOLE_GPU
        action: Callable[[], None]
        kind: Kind | None = None
        if request.fault is FaultKind.XID:
            assert request.xid is not None
            action, kind = functools.partial(nvml.inject_xid, uuid, request.xid), Kind.XID
            fields["xid"] = str(request.xid)
            if request.xid in self._health.ignored_xids:
                fields["note"] = f"Xid {request.xid} is ignored (--health-ignore-xids): no taint"
        elif request.fault is FaultKind.ECC:
            action, kind = functools.partial(nvml.inject_ecc, uuid, double_bit=True), Kind.ECC
        elif request.fault is FaultKind.LOST:
            action, kind = functools.partial(nvml.set_lost, uuid), Kind.GPU_LOST
        else:
            action = functools.partial(nvml.recover, uuid)
            fields["note"] = "taints clear once the quiet period passes (--health-quiet-period)"
        fields["uuid"] = uuid
        fields["devices"] = ",".join(devices_for(inventory, gpu_uuid, gi, ci)) or "-"
        if kind is not None:
            fields["effect"] = self._health.effect(kind) or "off"
        return _Plan(action, fields)

    def _refuse(self, name: str, reason: str) -> None:
        """One warning line; the entry moved aside (its reason beside it) or, if it cannot
        be, removed, so it is not refused again at every poll."""
        where = f"{REJECTED_SUBDIR}/"
        try:
            rejected = self._rejected_dir()
            with contextlib.suppress(OSError):  # a name too long for the suffix: log only
                _write_reason(rejected / (name + REASON_SUFFIX), reason)
            _remove(rejected / name)
            os.rename(self.directory / name, rejected / name)
        except FileNotFoundError:
            return  # withdrawn meanwhile
        except OSError as err:
            try:
                _remove(self.directory / name)
                where = f"removed: cannot move it aside ({err.strerror or err})"
            except OSError as err2:
                where = f"left in place: cannot move or remove it ({err2.strerror or err2})"
        else:
            with contextlib.suppress(OSError):
                self._prune(rejected)
        log.warning("simulated fault refused", extra={
            "file": printable(name), "reason": printable(reason, 500), "moved_to": where})

    def _rejected_dir(self) -> Path:
        path = self.directory / REJECTED_SUBDIR
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                return path
            _remove(path)  # a symlink or file planted there: never followed
        except FileNotFoundError:
            pass
        path.mkdir(mode=0o700)
        return path

    def _prune(self, rejected: Path) -> None:
        """Keep the newest ``MAX_REJECTED`` entries."""
        with os.scandir(rejected) as it:
            entries = [(e.stat(follow_symlinks=False).st_mtime_ns, e.name) for e in it
                       if not e.name.startswith(".")]
        if len(entries) <= MAX_REJECTED:
            return
        for _, name in sorted(entries)[: len(entries) - MAX_REJECTED]:
            with contextlib.suppress(OSError):
                _remove(rejected / name)


def _listing(names: list[str], limit: int = 12) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
