"""The plugin registration service on ``<kubelet>/plugins_registry/<driver>-reg.sock``.

``GetInfo`` answers from memory (the kubelet allows 1 s). ``NotifyRegistrationStatus`` is
recorded: ``registered`` is true only while the kubelet's latest word on the socket now
listening is a confirmation (the agent's /readyz waits for it). A kubelet that reports failure,
or never calls within ``timeout_s``, does not retry on its own (kubernetes #133725), so the
socket is then recreated: the kubelet's directory watcher sees a new socket and starts a fresh
registration. A confirmation that arrives during the pause before recreating (a 1.36+ kubelet
retries by itself) keeps the socket.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.plugin.sockets import bind_unix, remove_socket
from protos.pluginregistration import api_pb2 as reg_pb2
from protos.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)
PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: Newest first. The 1.37 kubelet picks the first of its own list (v1, then v1alpha1) that we
#: advertise; 1.35 ignores the entries and always calls v1alpha1. Must name exactly the
#: services ``agent.health.add_health_services`` serves (tests/plugin checks).
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    registered: bool
    error: str


class _Servicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, owner: RegistrationServer, generation: int) -> None:
        self._owner = owner
        #: Which of the owner's sockets this one serves (``RegistrationServer.generation``).
        self._generation = generation

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        o = self._owner
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=o.driver, endpoint=str(o.endpoint),
            supported_versions=list(o.versions),
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        self._owner.notified(RegistrationStatus(request.plugin_registered, request.error),
                             generation=self._generation)
        return reg_pb2.RegistrationStatusResponse()


class RegistrationServer:
    def __init__(
        self,
        path: Path,
        driver: str,
        endpoint: Path,
        versions: Sequence[str] = DRA_SERVICES,
        *,
        timeout_s: float = 30.0,
        retry_delay_s: float = 1.0,
    ) -> None:
        self.path = path
        self.driver = driver
        self.endpoint = endpoint
        self.versions = tuple(versions)
        self.timeout_s = timeout_s
        #: First pause before recreating after a refusal, doubled per consecutive refusal
        #: (capped at ``timeout_s``), so a kubelet that keeps refusing is not hammered.
        self.retry_delay_s = retry_delay_s
        #: How many times the socket was recreated (and the new one is listening) to provoke
        #: a new registration.
        self.recreations = 0
        self._status: RegistrationStatus | None = None
        #: Counts the sockets listened on; a notice from a replaced one is not about this one.
        self._generation = 0
        self._server: grpc.Server | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> RegistrationStatus | None:
        """The kubelet's latest notice about the socket now listening; None before it, and
        again from the moment the watchdog replaces the socket until the new one's."""
        return self._status

    @property
    def registered(self) -> bool:
        """The kubelet has confirmed the registration of the socket now listening."""
        status = self._status
        return status is not None and status.registered

    def notified(self, status: RegistrationStatus, *, generation: int | None = None) -> None:
        """Record the kubelet's notice; ``generation``: the socket it came in on (None: the
        current one). A notice that reaches a socket being replaced is dropped: it is about
        a registration the kubelet is about to drop, not the new socket's."""
        with self._cond:
            if generation is not None and generation != self._generation:
                log.info("registration notice for a replaced socket ignored",
                         extra={"driver": self.driver, "registered": status.registered})
                return
            self._status = status
            self._cond.notify_all()
        if status.registered:
            log.info("registered with the kubelet", extra={"driver": self.driver})
        else:
            log.error(
                "kubelet refused the registration; recreating the socket",
                extra={"driver": self.driver, "error": status.error},
            )

    def start(self) -> None:
        self._listen()
        self._thread = threading.Thread(
            target=self._watch, name="registration-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self, grace_s: float = 1.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._shutdown(grace_s)

    def alive(self) -> bool:
        """The watchdog is running (it ends only when stopped). If it died, nothing would ever
        recreate a refused or ignored registration socket again."""
        return self._thread is not None and self._thread.is_alive()

    def wait_registered(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.registered, timeout_s)

    def _listen(self) -> None:
        # Two unary methods the kubelet calls once per registration, each answered from
        # memory: two threads, a small queue, small messages are all it ever needs.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"),
            maximum_concurrent_rpcs=8,
            options=[("grpc.max_receive_message_length", 64 * 1024)],
        )
        reg_grpc.add_RegistrationServicer_to_server(_Servicer(self, self._generation), server)
        bind_unix(server, self.path)
        server.start()
        self._server = server

    def _shutdown(self, grace_s: float) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        remove_socket(self.path)

    def _watch(self) -> None:
        """Recreate the socket on a refusal, or when no notification came in time."""
        refusals = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._status is not None,
                                    self.timeout_s)
                if self._stopping:
                    return
                status = self._status
                if status is not None and status.registered:
                    # Registered: wait until stopped or the kubelet reports a new failure
                    # (a restarted kubelet registers again on the same socket).
                    self._cond.wait_for(
                        lambda: self._stopping
                        or (self._status is not None and not self._status.registered)
                    )
                    if self._stopping:
                        return
            if status is None:
                log.warning(
                    "no registration from the kubelet in time; recreating the socket",
                    extra={"driver": self.driver, "timeout_s": self.timeout_s},
                )
            else:
                refusals += 1
                delay = min(self.retry_delay_s * 2 ** (refusals - 1), self.timeout_s)
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopping or self.registered, delay):
                        if self._stopping:
                            return
                        # The kubelet retried on this socket and registered it: keep it.
                        refusals = 0
                        continue
            with self._cond:
                # From here the old socket's notices are stale, and nothing is confirmed.
                self._generation += 1
                self._status = None
            self._shutdown(0)
            self._listen()
            # Counted once the new socket answers: a reader seeing the count never reaches
            # the old one, which stays on disk until _shutdown removes it.
            self.recreations += 1
