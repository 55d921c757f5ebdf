"""The plugin's two sockets, served before the parts behind them exist.

``ServedSockets`` takes the instance lock, serves the DRA socket and then the registration
socket; ``GetInfo`` answers from memory at once. The DRA services (and the health stream, when
health is on) are served by stand-ins that wait for ``open()``, which hands them the real
services' handlers once the checkpoint is recovered. ``PluginServer`` builds one itself and
opens it in ``start()``; ``dra-agent run`` builds it first, right after the few modules it
needs, so the kubelet can register the plugin while the rest of the agent loads
(agent/daemon/daemon.py says why that is honest).

A unary call (prepare, unprepare) that comes before ``open()`` waits at most ``wait_s``, then
is answered UNAVAILABLE, which the kubelet retries; a health stream waits until the plugin
opens or stops (it is long-lived anyway, and the kubelet does not reopen a failed one at once).
Nothing is prepared before ``open()``: recovery (the checkpoint, lost CDI specs rewritten)
comes first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.plugin.limits import MAX_STREAMS, StreamSlots, max_concurrent_rpcs, server_options
from agent.plugin.registration import DRA_SERVICES, HEALTH_SERVICES, RegistrationServer
from agent.plugin.sockets import InstanceLock, SocketPaths, bind_unix, remove_socket, socket_paths
from protos.dra.v1 import api_pb2_grpc as dra_v1
from protos.dra.v1beta1 import api_pb2_grpc as dra_v1beta1
from protos.drahealth.v1 import api_pb2_grpc as health_v1
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1

log = logging.getLogger("agent.plugin")

#: How long a prepare or unprepare that reaches the DRA socket before the plugin is ready
#: waits for it. The rest of a start (imports, discovery, recovery) takes well under a second
#: on a quiet node and a few on a loaded one or a slow NVML; the kubelet's own deadline is
#: 45 s and it retries an UNAVAILABLE answer, so a wait far shorter than its deadline never
#: holds a kubelet thread long for an agent that is stuck or failing.
READY_WAIT_S = 10.0

#: The generated ``add_*Servicer_to_server`` of every service the DRA socket serves, DRA first.
_DRA_ADDERS: tuple[Callable[[Any, Any], None], ...] = (
    dra_v1.add_DRAPluginServicer_to_server, dra_v1beta1.add_DRAPluginServicer_to_server)
_HEALTH_ADDERS: tuple[Callable[[Any, Any], None], ...] = (
    health_v1.add_DRAResourceHealthServicer_to_server,
    health_v1alpha1.add_DRAResourceHealthServicer_to_server)

#: A service's method handlers by method name.
Handlers = Mapping[str, grpc.RpcMethodHandler]


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """The plugin's sockets and registration; what a prepare does is the preparer's
    (``agent.prepare.options.PrepareOptions``)."""

    driver_name: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    pod_uid: str | None = None
    rolling_update: bool = False
    registration_timeout_s: float = 30.0
    #: Threads for prepare/unprepare calls; health streams get their own on top
    #: (``agent.plugin.limits``).
    max_workers: int = 16


class HandlerRecorder:
    """Stands in for a ``grpc.Server`` to the generated ``add_*_to_server`` functions: keeps
    each service's method handlers by the service's full name."""

    def __init__(self) -> None:
        self.services: dict[str, Handlers] = {}

    def add_generic_rpc_handlers(self, _handlers: Iterable[Any]) -> None:
        pass  # the registered handlers below are the same methods

    def add_registered_method_handlers(self, service: str, handlers: Handlers) -> None:
        self.services[service] = dict(handlers)


class Gate:
    """Where the stand-ins wait: closed until ``open()`` hands over the real handlers, or for
    good once ``close()`` is called (the plugin stops)."""

    def __init__(self, wait_s: float = READY_WAIT_S) -> None:
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._services: Mapping[str, Handlers] | None = None
        self._closed = False

    @property
    def services(self) -> Mapping[str, Handlers] | None:
        """What ``open()`` handed over; None while closed."""
        return self._services

    def open(self, services: Mapping[str, Handlers]) -> None:
        with self._cond:
            self._services = services
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def call(self, service: str, method: str, bounded: bool, request: Any,
             context: grpc.ServicerContext) -> Any:
        """Run ``service``'s ``method`` once open; abort UNAVAILABLE when it does not open
        within ``wait_s`` (``bounded``) or closes."""
        services = self._services
        if services is None:
            services = self._wait(bounded, context)
        handler = services[service][method]
        behaviour = handler.unary_unary or handler.unary_stream
        return behaviour(request, context)

    def _wait(self, bounded: bool, context: grpc.ServicerContext) -> Mapping[str, Handlers]:
        deadline = time.monotonic() + self.wait_s if bounded else None
        with self._cond:
            while self._services is None and not self._closed and context.is_active():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                # A stream's wait wakes now and then to notice a kubelet that went away.
                self._cond.wait(1.0 if left is None else min(left, 1.0))
            services = self._services
        if services is not None and not self._closed:
            return services
        why = "is stopping" if self._closed else f"is still starting after {self.wait_s:g} s"
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      f"the DRA plugin {why}: not ready to prepare or unprepare yet, retry")
        raise AssertionError("abort returns only by raising")  # pragma: no cover


class _StandIn:
    """One service's servicer until the gate opens: each method waits there, then runs the
    real handler. ``service`` is learnt from the generated code as it registers the methods."""

    def __init__(self, gate: Gate, bounded: bool) -> None:
        self._gate = gate
        self._bounded = bounded
        self.service = ""

    def __getattr__(self, method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def behaviour(request: Any, context: grpc.ServicerContext) -> Any:
            return self._gate.call(self.service, method, self._bounded, request, context)

        return behaviour


class _Naming:
    """Passes the generated registrations on to the server, telling the stand-in its name."""

    def __init__(self, server: grpc.Server, stand_in: _StandIn) -> None:
        self._server = server
        self._stand_in = stand_in

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Handlers) -> None:
        self._stand_in.service = service
        self._server.add_registered_method_handlers(service, handlers)


class ServedSockets:
    """The instance lock, the DRA server (stand-ins until ``open()``) and the registration."""

    def __init__(self, options: PluginOptions, *, health: bool,
                 wait_s: float = READY_WAIT_S) -> None:
        self.options = options
        self.health = health
        self.paths: SocketPaths = socket_paths(
            options.kubelet_dir, options.driver_name, options.pod_uid, options.rolling_update
        )
        versions = DRA_SERVICES if not health else (*DRA_SERVICES, *HEALTH_SERVICES)
        self.registration = RegistrationServer(
            self.paths.registration, options.driver_name, self.paths.dra, versions,
            timeout_s=options.registration_timeout_s,
        )
        self.lock = InstanceLock(self.paths.instance_lock)
        #: Open response streams (the kubelet's health stream), at most MAX_STREAMS.
        self.streams = StreamSlots(MAX_STREAMS)
        self.gate = Gate(wait_s)
        self._served: set[str] = set()
        self._dra: grpc.Server | None = None

    @property
    def serving(self) -> bool:
        return self._dra is not None

    def start(self) -> None:
        """Take the lock (if not held), serve the DRA socket, then register; raises
        ``SocketError`` (``AlreadyRunningError``) and leaves nothing behind on failure."""
        try:
            if not self.lock.held:
                self.lock.acquire()
            if self._dra is None:
                self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
                self._serve_dra()
                self.registration.start()
        except BaseException:
            self.stop(0)
            raise

    def _serve_dra(self) -> None:
        # Streams hold their thread while open: they get MAX_STREAMS threads of their own
        # (StreamSlots refuses more), so max_workers always remain for prepare/unprepare.
        workers = self.options.max_workers
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers + MAX_STREAMS,
                                       thread_name_prefix="dra"),
            interceptors=[self.streams],
            options=server_options(),
            maximum_concurrent_rpcs=max_concurrent_rpcs(workers),
        )
        for adder, bounded in [*((a, True) for a in _DRA_ADDERS),
                               *((a, False) for a in (_HEALTH_ADDERS if self.health else ()))]:
            stand_in = _StandIn(self.gate, bounded)
            adder(stand_in, _Naming(server, stand_in))
            self._served.add(stand_in.service)
        if self.gate.services is not None:
            self._check(self.gate.services)
        bind_unix(server, self.paths.dra)
        server.start()
        self._dra = server

    def open(self, services: Mapping[str, Handlers]) -> None:
        """Hand the stand-ins the real services (``HandlerRecorder.services``): calls run
        from now on. The services must be exactly those served."""
        if self._dra is not None:
            self._check(services)
        self.gate.open(services)

    def _check(self, services: Mapping[str, Handlers]) -> None:
        if set(services) != self._served:  # a service added to one side only: a bug
            raise ValueError(f"the plugin serves {sorted(self._served)}, "
                             f"not {sorted(services)}")

    def stop_registration(self, grace_s: float) -> None:
        self.registration.stop(grace_s)

    def stop(self, grace_s: float) -> None:
        """Stop registering, refuse what still waits, stop serving, remove both sockets and
        release the lock; a no-op unless this instance holds the lock."""
        if not self.lock.held:
            return
        self.registration.stop(min(grace_s, 1.0))
        self.stop_dra(grace_s)
        self.release()

    def stop_dra(self, grace_s: float) -> None:
        self.gate.close()
        if self._dra is not None:
            self._dra.stop(grace_s).wait()
            self._dra = None
        remove_socket(self.paths.dra)

    def release(self) -> None:
        self.lock.release()
