"""``HealthServicer``: the kubelet's ``DRAResourceHealth/NodeWatchResources``, v1 and v1alpha1.

Kubernetes 1.37 added ``v1.DRAResourceHealth`` and prefers it when the plugin lists it; 1.35
and 1.36 only call ``v1alpha1``, which 1.37 still accepts through 1.39. The two differ only in
their package, so one servicer serves both (``add_health_services``) from one monitor, and
both streams go through the same stream limits.

Each stream gets the complete device list at once, again after every published change, and
again every ``resend_period_s`` even when nothing changed: the kubelet marks a device Unknown
when it has not heard of it within its health timeout (30 s by default), so each entry also
carries ``health_check_timeout_seconds`` comfortably above the resend period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol

from agent.health.model import ChangeFeed, DeviceHealth, HealthState
from protos.drahealth.v1 import api_pb2 as pb
from protos.drahealth.v1 import api_pb2_grpc as pb_grpc
from protos.drahealth.v1alpha1 import api_pb2 as pb_v1alpha1
from protos.drahealth.v1alpha1 import api_pb2_grpc as pb_v1alpha1_grpc

log = logging.getLogger("agent.health.stream")

#: The kubelet truncates longer messages; we cut first so the end stays readable.
MAX_MESSAGE = 1024
#: Advertised service name -> (messages, generated servicer module), newest first: the order
#: the registration lists them in.
HEALTH_APIS: Mapping[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAResourceHealth": (pb, pb_grpc),
    "v1alpha1.DRAResourceHealth": (pb_v1alpha1, pb_v1alpha1_grpc),
}
HEALTH_SERVICES = tuple(HEALTH_APIS)
# The enum numbers are the same in both versions (tests/protos checks them).
_STATUS = {
    HealthState.HEALTHY: pb.HEALTHY,
    HealthState.UNHEALTHY: pb.UNHEALTHY,
    HealthState.UNMONITORED: pb.UNKNOWN,
}


class HealthSource(Protocol):
    """What the servicer needs of a HealthMonitor."""

    changes: ChangeFeed

    def snapshot(self) -> Mapping[str, DeviceHealth]: ...


def _message(health: DeviceHealth) -> str:
    text = health.message
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class HealthServicer:
    def __init__(self, monitor: HealthSource, pool_name: str, resend_period_s: float = 30,
                 *, wall_clock: Callable[[], float] = time.time) -> None:
        if resend_period_s <= 0:
            raise ValueError(f"resend_period_s must be positive, got {resend_period_s}")
        self.monitor = monitor
        self.pool_name = pool_name
        self.resend_period_s = resend_period_s
        self.wall_clock = wall_clock
        #: Three missed resends before the kubelet may call a device Unknown.
        self.timeout_s = max(30, int(resend_period_s * 3))
        self._lock = threading.Lock()
        self._streams: dict[str, int] = dict.fromkeys(HEALTH_APIS, 0)

    @property
    def streams(self) -> int:
        """Streams open now, both versions (normally one: the kubelet's)."""
        with self._lock:
            return sum(self._streams.values())

    def streams_by_service(self) -> dict[str, int]:
        """Open streams per service name: which version the kubelet chose."""
        with self._lock:
            return dict(self._streams)

    def _opened(self, service: str, delta: int) -> None:
        with self._lock:
            self._streams[service] += delta

    def response(self, api: ModuleType = pb) -> Any:
        """The complete list, as sent on the stream, in the messages of ``api``."""
        now = int(self.wall_clock())
        devices = [
            api.DeviceHealth(
                device=api.DeviceIdentifier(pool_name=self.pool_name, device_name=name),
                health=_STATUS[h.state],
                last_updated_time=now,
                health_check_timeout_seconds=self.timeout_s,
                message=_message(h),
            )
            for name, h in sorted(self.monitor.snapshot().items())
        ]
        return api.NodeWatchResourcesResponse(devices=devices)

    def watch(self, service: str, context: Any) -> Iterator[Any]:
        """One kubelet stream of ``service`` (a key of ``HEALTH_APIS``)."""
        api, _ = HEALTH_APIS[service]
        feed = self.monitor.changes
        # A cancelled stream must not keep a server thread asleep for a whole resend period.
        context.add_callback(feed.wake)
        self._opened(service, 1)
        extra = {"pool": self.pool_name, "service": service}
        log.info("kubelet health stream opened", extra=extra)
        try:
            seen = feed.version
            yield self.response(api)
            while context.is_active() and not feed.closed:
                version = feed.wait(seen, self.resend_period_s)
                if not context.is_active() or feed.closed:
                    break
                seen = version
                yield self.response(api)
        finally:
            self._opened(service, -1)
            log.info("kubelet health stream closed", extra=extra)


class _Version:
    """The generated servicer shape for one version, answering from the shared servicer."""

    def __init__(self, servicer: HealthServicer, service: str) -> None:
        self._servicer = servicer
        self._service = service

    def NodeWatchResources(  # noqa: N802 (the gRPC method name)
        self, request: Any, context: Any
    ) -> Iterator[Any]:
        return self._servicer.watch(self._service, context)


def add_health_services(servicer: HealthServicer, server: Any) -> None:
    """Serve every version of ``HEALTH_APIS`` on ``server`` from ``servicer``."""
    for service, (_, grpc_module) in HEALTH_APIS.items():
        grpc_module.add_DRAResourceHealthServicer_to_server(_Version(servicer, service), server)
