"""The kubelet's plugin watcher and registration, as 1.34+ runs them for DRA plugins.

The kubelet watches its plugins_registry directory with inotify and reconciles desired state
(sockets present, with a timestamp) against actual state (plugins registered) every second. We
scan instead of using inotify; a short poll interval gives the same state machine:

- a socket that appears, or is re-created (new inode/mtime), is registered (again); a chmod
  (ctime only) is not a new socket, as the kubelet reacts to create events only;
- a socket that disappears or changes is deregistered first;
- validation failures (wrong type, no known service; with ``strict_registration`` also a bad
  name or endpoint) are notified to the plugin and retried with exponential back-off (0.5 s
  doubling to 2m2s);
- a failure after validation ("endpoint already registered", the DRA handler's
  RegisterPlugin) depends on the minor played (``minor``): 1.35 notifies it and never retries
  until the socket is re-created (kubernetes issue 133725); 1.36+ removes the plugin from its
  actual state first, so the reconciler tries again: on its next pass when the plugin took the
  notice, with back-off when NotifyRegistrationStatus failed;
- a failed NotifyRegistrationStatus(true): 1.35 only logs it (the registration stands); 1.36+
  deregisters the plugin again and retries with back-off.
"""

from __future__ import annotations

import logging
import re
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import grpc

from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc
from tests.fakes.kubelet.types import Registration, RegistrationFailure

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
GET_INFO_TIMEOUT = 1.0  # kubelet operation generator: GetInfo deadline
NOTIFY_TIMEOUT = 5.0  # kubelet: NotifyRegistrationStatus deadline
DIAL_TIMEOUT = 10.0  # kubelet: blocking dial of the registration socket
RETRY_INITIAL = 0.5  # kubelet exponential back-off: first wait, doubled per failure
RETRY_MAX = 122.0  # ... capped at 2m2s
UNIX_PATH_MAX = 108  # sun_path, including the terminating NUL
# healthServicesSupportedByKubelet, newest first. 1.35 has no such list: it always calls
# v1alpha1 (HEALTH_SERVICES_135 makes the stand-in do the same).
HEALTH_SERVICES_137 = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH_SERVICES_135 = ("v1alpha1.DRAResourceHealth",)
#: The kubelet minors the stand-in can play (``minor``), and each one's health services.
MINORS = {"1.37": HEALTH_SERVICES_137, "1.35": HEALTH_SERVICES_135}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 100),
]

Identity = tuple[int, int, int]  # st_dev, st_ino, st_mtime_ns of a socket file


@dataclass(slots=True)
class _Active:
    """A socket in actual state; ``registration`` is None after a failed, unretried register."""

    identity: Identity
    registration: Registration | None
    channel: grpc.Channel | None = None


@dataclass(slots=True)
class _Retry:
    identity: Identity
    not_before: float
    backoff: float


#: What the kubelet does after a failed registration attempt: try again after the back-off
#: (the operation returned an error), on the reconciler's next pass with the back-off reset
#: (it returned nil, yet the plugin is not in actual state), or not until the socket changes.
Then = Literal["back-off", "next pass", "never"]


class _RejectedError(Exception):
    """Registration refused; ``then`` says what the kubelet does about it by itself."""

    def __init__(self, message: str, *, then: Then = "back-off", notified: bool = True) -> None:
        super().__init__(message)
        self.then: Then = then
        self.notified = notified


@dataclass(slots=True)
class _State:
    active: dict[Path, _Active] = field(default_factory=dict)
    retry: dict[Path, _Retry] = field(default_factory=dict)
    pending: set[Path] = field(default_factory=set)
    registrations: list[Registration] = field(default_factory=list)
    deregistrations: list[Registration] = field(default_factory=list)
    failures: list[RegistrationFailure] = field(default_factory=list)


class PluginWatcher:
    """Registers the DRA plugins whose sockets appear in ``registry_dir``."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        minor: str = "1.37",
        known_services: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        known_health_services: Sequence[str] | None = None,
        poll_interval: float = 0.05,
        retry_initial: float = RETRY_INITIAL,
        dial_timeout: float = DIAL_TIMEOUT,
        strict_registration: bool = True,
    ) -> None:
        """``minor``: the kubelet played, "1.37" or "1.35" (its registration retries and, unless
        ``known_health_services`` says otherwise, its health services). ``strict_registration``
        (default on) also refuses what the real kubelet registers and then cannot call: a driver
        name that is no DNS subdomain, an endpoint that is relative, too long or no socket."""
        if minor not in MINORS:
            raise ValueError(f"the stand-in plays kubelet {' or '.join(MINORS)}, not {minor!r}")
        self.registry_dir = Path(registry_dir)
        self.minor = minor
        self.known_services = tuple(known_services)
        self.known_health_services = tuple(
            MINORS[minor] if known_health_services is None else known_health_services)
        self.strict_registration = strict_registration
        self.poll_interval = poll_interval
        self.retry_initial = retry_initial
        self.dial_timeout = dial_timeout
        self._state = _State()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        # The kubelet creates the registration directory at start.
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kubelet-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            channels = [a.channel for a in self._state.active.values() if a.channel is not None]
            self._state.active.clear()
            self._cond.notify_all()
        for channel in channels:
            channel.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what tests look at ---------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        """Every successful registration, oldest first (a re-created socket adds one)."""
        with self._cond:
            return list(self._state.registrations)

    @property
    def deregistrations(self) -> list[Registration]:
        with self._cond:
            return list(self._state.deregistrations)

    @property
    def failures(self) -> list[RegistrationFailure]:
        with self._cond:
            return list(self._state.failures)

    def held(self, driver: str) -> list[Registration]:
        """The instances of ``driver`` in the kubelet's store (actual state), oldest first:
        like the real one, the stand-in adds an instance there before it notifies the plugin,
        so one that took a ``plugin_registered=true`` notice is already held."""
        with self._cond:
            return [a.registration for a in self._state.active.values()
                    if a.registration is not None and a.registration.driver == driver]

    def registered(self, driver: str) -> Registration | None:
        """The instance calls go to: the most recently registered live one."""
        with self._cond:
            return self._current(driver)

    def wait_registered(self, driver: str, timeout: float = 5, *, since: int = 0) -> Registration:
        """Wait for a live registration of ``driver`` at index >= ``since`` in ``registrations``.

        Pass ``since=len(watcher.registrations)`` before re-creating a socket to wait for the
        re-registration rather than find the old one.
        """

        def found() -> Registration | None:
            return next(
                (
                    r
                    for r in self._state.registrations[since:]
                    if r.driver == driver and self._is_live(r)
                ),
                None,
            )

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                recent = [f.error for f in self._state.failures[-3:]]
                raise TimeoutError(f"{driver} not registered within {timeout}s; failures: {recent}")
            result = found()
            assert result is not None
            return result

    def wait_failed(self, timeout: float = 5, *, since: int = 0) -> RegistrationFailure:
        """Wait for a registration failure at index >= ``since`` in ``failures``."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._state.failures) > since, timeout):
                raise TimeoutError(f"no registration failure within {timeout}s")
            return self._state.failures[since]

    def wait_deregistered(self, driver: str, timeout: float = 5, *, since: int = 0) -> Registration:
        """Wait for a deregistration of ``driver`` at index >= ``since`` in ``deregistrations``."""

        def found() -> Registration | None:
            return next(
                (r for r in self._state.deregistrations[since:] if r.driver == driver), None
            )

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"{driver} not deregistered within {timeout}s")
            result = found()
            assert result is not None
            return result

    # --- for the DRA calls ----------------------------------------------------------------

    def _current(self, driver: str) -> Registration | None:
        # Kubelet 1.34+: the most recently registered instance that is connected. A live
        # registration here is one whose socket is still the one we registered.
        live = [r for r in self._state.registrations if r.driver == driver and self._is_live(r)]
        return live[-1] if live else None

    def _is_live(self, registration: Registration) -> bool:
        active = self._state.active.get(registration.socket_path)
        return active is not None and active.registration is registration

    def connection(self, driver: str) -> tuple[Registration, grpc.Channel] | None:
        """The current instance of ``driver`` and its long-lived channel, or None."""
        with self._cond:
            registration = self._current(driver)
            if registration is None:
                return None
            active = self._state.active[registration.socket_path]
            if active.channel is None:
                # One connection per registered instance, kept until it deregisters; the
                # kubelet's target is "unix:" + endpoint (a relative endpoint stays relative).
                active.channel = grpc.insecure_channel(f"unix:{registration.endpoint}")
            return registration, active.channel

    # --- the watcher ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                desired = self._scan()
                if desired is not None:
                    self._reconcile(desired)
            except Exception:  # one bad pass must not end the watcher; the next pass retries
                log.exception("kubelet stand-in reconcile failed")
            self._stop.wait(self.poll_interval)

    def _scan(self) -> dict[Path, Identity] | None:
        """Desired state: every socket under the registry dir (recursively), not hidden ones.

        None when the directory could not be read this time (a subdirectory vanished during the
        walk, say); an empty answer would deregister every plugin.
        """
        found: dict[Path, Identity] = {}
        try:
            entries = list(self.registry_dir.rglob("*"))
        except OSError:
            return None
        for path in entries:
            if path.name.startswith("."):
                continue
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found[path] = (st.st_dev, st.st_ino, st.st_mtime_ns)
        return found

    def _reconcile(self, desired: dict[Path, Identity]) -> None:
        now = time.monotonic()
        todo: list[tuple[Path, Identity]] = []
        closing: list[grpc.Channel] = []
        with self._cond:
            st = self._state
            # First deregister what vanished or was re-created, then register what is new.
            for path, active in list(st.active.items()):
                if desired.get(path) != active.identity:
                    del st.active[path]
                    if active.channel is not None:
                        closing.append(active.channel)
                    if active.registration is not None:
                        st.deregistrations.append(active.registration)
                        log.info("plugin deregistered", extra={"socket": str(path)})
                    self._cond.notify_all()
            for path in list(st.retry):
                if desired.get(path) != st.retry[path].identity:
                    del st.retry[path]  # re-created or gone: a new socket starts afresh
            for path, identity in desired.items():
                if path in st.active or path in st.pending:
                    continue
                retry = st.retry.get(path)
                if retry is not None and now < retry.not_before:
                    continue
                st.pending.add(path)
                todo.append((path, identity))
        for channel in closing:  # outside the lock: a close can take a while
            channel.close()
        # One worker per socket, as the kubelet's operation executor runs them, so a socket
        # nobody answers on (up to the 10 s dial timeout) does not hold up the others.
        for path, identity in todo:
            threading.Thread(
                target=self._attempt,
                args=(path, identity),
                name=f"register {path.name}",
                daemon=True,
            ).start()

    def _attempt(self, path: Path, identity: Identity) -> None:
        failure: RegistrationFailure | None = None
        then: Then = "back-off"
        # The socket file appears at bind(), a moment before the plugin listens; short
        # reconnect back-off keeps a refused first connect from costing gRPC's default 1 s.
        channel = grpc.insecure_channel(f"unix://{path}", options=_FAST_RECONNECT)
        try:
            self._register(channel, path, identity)
        except _RejectedError as err:
            failure, then = RegistrationFailure(path, str(err), notified=err.notified), err.then
        except Exception as err:  # dial or GetInfo failed: there was nobody to notify
            failure = RegistrationFailure(path, f"{type(err).__name__}: {err}", notified=False)
        with self._cond:
            st = self._state
            st.pending.discard(path)
            if failure is not None and not self._stop.is_set():
                st.failures.append(failure)
                log.info(
                    "plugin registration failed",
                    extra={"socket": str(path), "error": failure.error, "then": then},
                )
                if then == "back-off":
                    prev = st.retry.get(path)
                    backoff = min(prev.backoff * 2, RETRY_MAX) if prev else self.retry_initial
                    st.retry[path] = _Retry(identity, time.monotonic() + backoff, backoff)
                elif then == "next pass":
                    # The operation succeeded as far as the kubelet's goroutine map knows: its
                    # back-off entry is dropped, the next pass starts it again.
                    st.retry.pop(path, None)
                else:
                    st.active[path] = _Active(identity, None)
            self._cond.notify_all()
        # Closed only now: closing a grpc channel can take a while, and the outcome should be
        # visible to waiting tests as soon as the plugin has been told.
        channel.close()

    @property
    def _deregisters_on_failure(self) -> bool:
        """1.36+ (operation_generator.go): a failed RegisterPlugin or notify(true) removes the
        plugin from actual state (and deregisters it after a failed notify), so it is retried."""
        return self.minor != "1.35"

    def _register(self, channel: grpc.Channel, path: Path, identity: Identity) -> None:
        grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=GET_INFO_TIMEOUT)
        try:
            registration = self._validate(path, info)
        except _RejectedError as err:
            # Type or ValidatePlugin: an error either way, retried after the back-off.
            self._notify(stub, False, str(err))
            raise
        try:
            self._add(path, identity, registration)
        except _RejectedError as err:
            told = self._notify(stub, False, str(err))
            if not self._deregisters_on_failure:
                # 1.35: the plugin stays in actual state with no registration behind it.
                err.then = "never"
            elif told:
                # 1.36+: RemovePlugin, then the operation returns the notify's nil.
                err.then = "next pass"
            raise
        if not self._notify(stub, True, "") and self._deregisters_on_failure:
            with self._cond:
                dropped = self._drop(path, registration)
            if dropped is not None:
                dropped.close()
            raise _RejectedError(
                f"failed to send registration status at socket {path}; deregistered",
                notified=False,
            )
        with self._cond:
            # Published only once the plugin has been told, so a test that waits for the
            # registration can rely on the plugin knowing about it.
            if not self._stop.is_set():
                self._state.registrations.append(registration)
                log.info("plugin registered", extra={"driver": registration.driver})

    def _add(self, path: Path, identity: Identity, registration: Registration) -> None:
        """The DRA handler's RegisterPlugin: one instance per (driver, endpoint)."""
        with self._cond:
            if self._stop.is_set():
                raise _RejectedError("kubelet is stopping")
            for other in self._state.active.values():
                r = other.registration
                if r is not None and (r.driver, r.endpoint) == (
                    registration.driver,
                    registration.endpoint,
                ):
                    raise _RejectedError(
                        f"endpoint {r.endpoint} already registered for {r.driver}"
                    )
            self._state.active[path] = _Active(identity, registration)

    def _drop(self, path: Path, registration: Registration) -> grpc.Channel | None:
        """1.36+ after a failed notify(true): RemovePlugin and DeRegisterPlugin. The instance
        was never published in ``registrations``, so it is no deregistration either. Returns
        the channel a call may have opened meanwhile, for the caller to close unlocked."""
        active = self._state.active.get(path)
        if active is None or active.registration is not registration:
            return None
        del self._state.active[path]
        self._cond.notify_all()
        return active.channel

    def _validate(self, path: Path, info: Any) -> Registration:
        if info.type != DRA_PLUGIN_TYPE:
            raise _RejectedError(
                f"no handler registered for plugin type: {info.type} at socket {path}"
            )
        name = info.name
        # An empty endpoint means the registration socket serves the DRA services too.
        endpoint = info.endpoint or str(path)
        if self.strict_registration:
            self._strict_checks(name, endpoint)
        versions = tuple(info.supported_versions)
        # 1.34+: the plugin's order decides; the first entry this kubelet knows wins.
        service = next((v for v in versions if v in self.known_services), None)
        if service is None:
            raise _RejectedError(
                f"none of the supported versions {list(versions)} is known; "
                f"this kubelet supports {list(self.known_services)}"
            )
        # 1.37 (pickHealthService): the kubelet's order decides, not the plugin's; the health
        # service is optional, so no match is no stream rather than a refusal.
        health = next((h for h in self.known_health_services if h in versions), "")
        return Registration(name, endpoint, service, path, versions, health)

    @staticmethod
    def _strict_checks(name: str, endpoint: str) -> None:
        """The stand-in's own checks (``strict_registration``; README.md): the real
        ValidatePlugin and RegisterPlugin look at the supported services only, register any
        name and endpoint, and the calls to an endpoint nobody listens on fail later."""
        if not name or len(name) > 63 or not _DNS_SUBDOMAIN.fullmatch(name):
            raise _RejectedError(f"invalid driver name {name!r}: not a DNS subdomain")
        if not endpoint.startswith("/"):
            raise _RejectedError(f"endpoint {endpoint!r} is not an absolute path")
        if len(endpoint.encode()) >= UNIX_PATH_MAX:
            raise _RejectedError(f"endpoint {endpoint!r} is too long for a socket")
        try:
            is_socket = stat.S_ISSOCK(Path(endpoint).stat().st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            raise _RejectedError(f"endpoint {endpoint} is not an existing socket")

    def _notify(self, stub: Any, ok: bool, error: str) -> bool:
        """NotifyRegistrationStatus; whether the plugin answered without an error."""
        try:
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=ok, error=error), timeout=NOTIFY_TIMEOUT
            )
        except grpc.RpcError as err:
            # The Go helper answers a failed registration with an error status (our agent
            # does not); what the kubelet makes of an error depends on the minor (_register).
            log.info("NotifyRegistrationStatus answered with an error", extra={"error": str(err)})
            return False
        return True
