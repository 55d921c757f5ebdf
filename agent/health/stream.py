"""``HealthServicer``: the kubelet's ``v1alpha1.DRAResourceHealth/NodeWatchResources``.

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
from typing import Any, Protocol

from agent.health.model import ChangeFeed, DeviceHealth, HealthState
from protos.drahealth.v1alpha1 import api_pb2 as pb
from protos.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc

log = logging.getLogger("agent.health.stream")

#: The kubelet truncates longer messages; we cut first so the end stays readable.
MAX_MESSAGE = 1024
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


class HealthServicer(pb_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
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
        self._streams = 0

    @property
    def streams(self) -> int:
        """Streams open now (normally one: the kubelet's)."""
        with self._lock:
            return self._streams

    def _opened(self, delta: int) -> None:
        with self._lock:
            self._streams += delta

    def response(self) -> pb.NodeWatchResourcesResponse:
        """The complete list, as sent on the stream."""
        now = int(self.wall_clock())
        devices = [
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self.pool_name, device_name=name),
                health=_STATUS[h.state],
                last_updated_time=now,
                health_check_timeout_seconds=self.timeout_s,
                message=_message(h),
            )
            for name, h in sorted(self.monitor.snapshot().items())
        ]
        return pb.NodeWatchResourcesResponse(devices=devices)

    def NodeWatchResources(  # noqa: N802 (the gRPC method name)
        self, request: Any, context: Any
    ) -> Iterator[pb.NodeWatchResourcesResponse]:
        feed = self.monitor.changes
        # A cancelled stream must not keep a server thread asleep for a whole resend period.
        context.add_callback(feed.wake)
        self._opened(1)
        log.info("kubelet health stream opened", extra={"pool": self.pool_name})
        try:
            seen = feed.version
            yield self.response()
            while context.is_active() and not feed.closed:
                version = feed.wait(seen, self.resend_period_s)
                if not context.is_active() or feed.closed:
                    break
                seen = version
                yield self.response()
        finally:
            self._opened(-1)
            log.info("kubelet health stream closed", extra={"pool": self.pool_name})
