"""The kubelet plugin: registration and the DRA gRPC services around a ``Preparer``.

The composition root (``agent.daemon.wiring``) builds the preparer and one ``PluginServer``
around it, as upstream's ``kubeletplugin.Start`` takes a driver's ``DRAPlugin``::

    server = PluginServer(options, preparer, claims, metrics)
    server.start()          # recovers, serves dra.sock, then registers
    ...
    server.stop(grace_s=5)  # stops serving and removes both sockets

Order matters: the DRA socket serves before the registration socket exists, so the kubelet
never registers an endpoint that does not answer yet.
"""

from __future__ import annotations

import logging
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.common.failpoints import Failpoints
from agent.common.metrics import Metrics
from agent.plugin.apiclaims import APIClaimSource
from agent.plugin.driver import ClaimSource, Preparer
from agent.plugin.framework import PluginFramework
from agent.plugin.limits import MAX_STREAMS, StreamSlots, max_concurrent_rpcs, server_options
from agent.plugin.registration import DRA_SERVICES, HEALTH_SERVICES, RegistrationServer
from agent.plugin.server import add_dra_services
from agent.plugin.sockets import (
    AlreadyRunningError,
    InstanceLock,
    SocketError,
    SocketPaths,
    bind_unix,
    remove_socket,
    socket_paths,
)

if TYPE_CHECKING:  # grpc is imported when the plugin serves, not with the daemon
    import grpc

    from agent.health.stream import HealthServicer

__all__ = [
    "APIClaimSource",
    "AlreadyRunningError",
    "PluginOptions",
    "PluginServer",
    "Preparer",
    "SocketError",
]

log = logging.getLogger(__name__)
#: Seconds an instance that has deregistered keeps serving while a successor is registered:
#: the kubelet's plugin watcher reconciles every second, then it calls the successor only.
HANDOVER_DRAIN_S = 2.0


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


class PluginServer:
    def __init__(
        self,
        options: PluginOptions,
        preparer: Preparer,
        claims: ClaimSource,
        metrics: Metrics | None = None,
        *,
        health_servicer: HealthServicer | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.options = options
        self.metrics = metrics or Metrics()
        self.paths: SocketPaths = socket_paths(
            options.kubelet_dir, options.driver_name, options.pod_uid, options.rolling_update
        )
        self.preparer = preparer
        self.framework = PluginFramework(
            options.driver_name,
            claims,
            preparer,
            self.metrics,
            serialize_lock=self.paths.serialize_lock if options.rolling_update else None,
            failpoints=failpoints,
        )
        #: Served on the DRA socket in every version of agent.health.HEALTH_SERVICES.
        self.health_servicer = health_servicer
        versions = DRA_SERVICES if health_servicer is None else (*DRA_SERVICES, *HEALTH_SERVICES)
        self.registration = RegistrationServer(
            self.paths.registration, options.driver_name, self.paths.dra, versions,
            timeout_s=options.registration_timeout_s,
        )
        self._lock = InstanceLock(self.paths.instance_lock)
        self._dra: grpc.Server | None = None
        #: Open response streams (the kubelet's health stream), at most MAX_STREAMS.
        self.streams = StreamSlots(MAX_STREAMS)

    @property
    def registered(self) -> bool:
        return self.registration.registered

    @property
    def serving(self) -> bool:
        return self._dra is not None

    def start(self) -> None:
        """Take the instance lock, recover, serve, register; raises on any failure."""
        self._lock.acquire()
        try:
            self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
            with self.framework.exclusive():
                self.preparer.recover()
            self._serve_dra()
            self.registration.start()
        except BaseException:
            self.stop(0)
            raise
        log.info(
            "kubelet plugin serving",
            extra={"endpoint": str(self.paths.dra), "registration": str(self.paths.registration)},
        )

    def _serve_dra(self) -> None:
        import grpc

        # Streams hold their thread while open: they get MAX_STREAMS threads of their own
        # (StreamSlots refuses more), so max_workers always remain for prepare/unprepare.
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.options.max_workers + MAX_STREAMS, thread_name_prefix="dra"
            ),
            interceptors=[self.streams],
            options=server_options(),
            maximum_concurrent_rpcs=max_concurrent_rpcs(self.options.max_workers),
        )
        add_dra_services(server, self.framework, self.metrics)
        if self.health_servicer is not None:
            from agent.health.stream import add_health_services

            # Both versions, under the same StreamSlots interceptor as everything else.
            add_health_services(self.health_servicer, server)
        bind_unix(server, self.paths.dra)
        server.start()
        self._dra = server

    def _handover_drain_s(self, grace_s: float) -> float:
        """How long to keep serving after deregistering: ``HANDOVER_DRAIN_S`` (within the
        grace period) while another instance of this driver is registered beside this one (a
        rolling update's successor), else nothing."""
        registry = self.paths.registration.parent
        driver = self.options.driver_name
        def sibling(path: Path) -> bool:  # another instance's registration socket
            name = path.name
            return path != self.paths.registration and (
                name == f"{driver}-reg.sock"
                or (name.startswith(f"{driver}-") and name.endswith("-reg.sock")))
        try:
            others = [p for p in registry.iterdir() if sibling(p)]
        except OSError:
            return 0.0
        return min(HANDOVER_DRAIN_S, grace_s) if others else 0.0

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop registration first (the kubelet stops sending), then the DRA service.

        A no-op unless this instance holds the instance lock: the sockets at these paths
        would otherwise belong to the agent that does.
        """
        if not self._lock.held:
            return
        self.registration.stop(min(grace_s, 1.0))
        drain = self._handover_drain_s(grace_s)
        if drain > 0 and self._dra is not None:
            # The kubelet holds this instance until its plugin watcher sees the registration
            # socket gone (its next reconcile, 1 s) and calls the newest *connected* instance
            # of the driver: right after a kubelet restart the successor may not be connected
            # yet, and a call refused here failed a Pod's prepare on a real node
            # (tests/cluster: FailedPrepareDynamicResources during a rolling update).
            log.info("handing over to a newer instance: still serving",
                     extra={"driver": self.options.driver_name, "seconds": drain})
            time.sleep(drain)
        if self._dra is not None:
            self._dra.stop(grace_s).wait()
            self._dra = None
        # The claim status writes queued by the last prepares (best effort: a restarted agent
        # reports what is still owed at the kubelet's next prepare of those claims).
        self.framework.close(min(grace_s, 2.0))
        remove_socket(self.paths.dra)
        self.preparer.close()
        self._lock.release()
