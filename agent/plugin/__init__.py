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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.common.metrics import Metrics
from agent.plugin.serving import HandlerRecorder, PluginOptions, ServedSockets
from agent.plugin.sockets import AlreadyRunningError, SocketError, SocketPaths

if TYPE_CHECKING:  # the framework (claims, checkpoint records) loads once the plugin is built
    from agent.common.failpoints import Failpoints
    from agent.health.stream import HealthServicer
    from agent.plugin.apiclaims import APIClaimSource
    from agent.plugin.driver import ClaimSource, Preparer

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


def __getattr__(name: str) -> Any:
    # ``from agent.plugin import APIClaimSource``, without loading the API client's claim code
    # with the package (the sockets are served before it is needed).
    if name == "APIClaimSource":
        from agent.plugin.apiclaims import APIClaimSource

        return APIClaimSource
    if name == "Preparer":
        from agent.plugin.driver import Preparer

        return Preparer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        sockets: ServedSockets | None = None,
    ) -> None:
        """``sockets``: the sockets ``dra-agent run`` served before this was built (their
        options and health setting must be these); by default this builds its own."""
        from agent.plugin.framework import PluginFramework

        if sockets is None:
            sockets = ServedSockets(options, health=health_servicer is not None)
        elif sockets.options != options or sockets.health != (health_servicer is not None):
            raise ValueError("the served sockets were made for other plugin options")
        self.options = options
        self.metrics = metrics or Metrics()
        self.sockets = sockets
        self.paths: SocketPaths = sockets.paths
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
        self.registration = sockets.registration
        #: Open response streams (the kubelet's health stream), at most MAX_STREAMS.
        self.streams = sockets.streams
        self._started = False

    @property
    def registered(self) -> bool:
        return self.registration.registered

    @property
    def serving(self) -> bool:
        """The DRA socket answers calls (not only waits): the plugin has started."""
        return self._started and self.sockets.serving

    def start(self) -> None:
        """Take the instance lock, recover, serve, register; raises on any failure. With
        sockets already served: recover, then let the calls that wait in."""
        sockets = self.sockets
        try:
            if not sockets.lock.held:
                sockets.lock.acquire()
            self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
            with self.framework.exclusive():
                self.preparer.recover()
            sockets.open(self._services())
            sockets.start()
        except BaseException:
            self.stop(0)
            raise
        self._started = True
        log.info(
            "kubelet plugin serving",
            extra={"endpoint": str(self.paths.dra), "registration": str(self.paths.registration)},
        )

    def _services(self) -> dict[str, Any]:
        """The handlers of every service the DRA socket serves, by service name."""
        from agent.plugin.server import add_dra_services

        recorder = HandlerRecorder()
        add_dra_services(recorder, self.framework, self.metrics)
        if self.health_servicer is not None:
            from agent.health.stream import add_health_services

            # Both versions, under the same StreamSlots interceptor as everything else.
            add_health_services(self.health_servicer, recorder)
        return recorder.services

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
        sockets = self.sockets
        if not sockets.lock.held:
            return
        self._started = False
        sockets.stop_registration(min(grace_s, 1.0))
        drain = self._handover_drain_s(grace_s)
        if drain > 0 and sockets.serving:
            # The kubelet holds this instance until its plugin watcher sees the registration
            # socket gone (its next reconcile, 1 s) and calls the newest *connected* instance
            # of the driver: right after a kubelet restart the successor may not be connected
            # yet, and a call refused here failed a Pod's prepare on a real node
            # (tests/cluster: FailedPrepareDynamicResources during a rolling update).
            log.info("handing over to a newer instance: still serving",
                     extra={"driver": self.options.driver_name, "seconds": drain})
            time.sleep(drain)
        sockets.stop_dra(grace_s)
        # The claim status writes queued by the last prepares (best effort: a restarted agent
        # reports what is still owed at the kubelet's next prepare of those claims).
        self.framework.close(min(grace_s, 2.0))
        self.preparer.close()
        sockets.release()
