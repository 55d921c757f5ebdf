"""The DRA node services, ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``, from one implementation.

Both versions have the same messages except that v1's ``Device`` has ``share_id``; each
servicer only converts messages and calls the framework. A gRPC error is returned only when
the request itself is unusable; everything about one claim goes into that claim's entry.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc

from agent.claim.model import ClaimRef
from agent.common.metrics import Metrics
from agent.plugin.framework import ClaimOutcome, PluginFramework
from protos.dra.v1 import api_pb2 as v1_pb2
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1_pb2
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)


class DRAService:
    """Message conversion shared by both versions; ``pb`` is the version's message module."""

    def __init__(
        self, framework: PluginFramework, pb: ModuleType, version: str, metrics: Metrics
    ) -> None:
        self._framework = framework
        self._pb = pb
        self._metrics = metrics
        self._share_ids = version == "v1"  # v1beta1's Device has no share_id field
        self._ids = itertools.count(1)  # request ids for the logs (next() is thread-safe)
        # Each method's labelled series, looked up once: ``labels()`` was four lookups per
        # call and 40% of the Python a call runs here (hack/benches/grpcpath).
        self._series = {m: _Series(metrics, m) for m in ("NodePrepareResources",
                                                         "NodeUnprepareResources")}

    def prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._measure("NodePrepareResources") as result:
            refs = self._refs(request, context)
            # The claim status writes start once the answer is sent (gRPC runs a call's
            # callbacks when it ends), not while it is: agent.plugin.statusqueue.
            later: list[Callable[[], None]] = []
            outcomes = self._framework.prepare(refs, next(self._ids), gone=_gone(context),
                                               later=later)
            if later and not context.add_callback(lambda: _start(later)):
                _start(later)  # the call has ended already
            response = self._pb.NodePrepareResourcesResponse()
            for uid, outcome in outcomes.items():
                entry = response.claims[uid]  # creates the entry, even when empty
                if outcome.error:
                    entry.error = outcome.error
                    result[0] = "error"
                else:
                    self._fill_devices(entry, outcome)
            return response

    def unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._measure("NodeUnprepareResources") as result:
            refs = self._refs(request, context)
            outcomes = self._framework.unprepare(refs, next(self._ids), gone=_gone(context))
            response = self._pb.NodeUnprepareResourcesResponse()
            for uid, outcome in outcomes.items():
                entry = response.claims[uid]
                entry.SetInParent()  # an empty success entry must still be sent
                if outcome.error:
                    entry.error = outcome.error
                    result[0] = "error"
            return response

    def _fill_devices(self, entry: Any, outcome: ClaimOutcome) -> None:
        assert outcome.record is not None
        for dev in outcome.record.devices:
            msg = entry.devices.add(
                request_names=list(dev.requests),
                pool_name=dev.pool,
                device_name=dev.device,
                cdi_device_ids=list(dev.cdi_ids),
            )
            if self._share_ids and dev.share_id:
                msg.share_id = dev.share_id

    def _refs(self, request: Any, context: grpc.ServicerContext) -> list[ClaimRef]:
        refs = [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
        uids = [r.uid for r in refs]
        if len(set(uids)) != len(uids):
            # The answer is a map by UID: two entries for one UID cannot both be answered.
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the request names the same claim UID twice"
            )
        return refs

    def _measure(self, method: str) -> _Timer:
        return _Timer(self._series[method])


def _start(reports: list[Callable[[], None]]) -> None:
    for start in reports:
        start()


def _gone(context: grpc.ServicerContext) -> Callable[[], bool]:
    """True once the kubelet no longer waits: its deadline (45 s) passed, or it cancelled."""

    def gone() -> bool:
        left = context.time_remaining()
        return not context.is_active() or (left is not None and left <= 0)

    return gone


class _Series:
    """One method's series of the call metrics (their labelled children)."""

    __slots__ = ("duration", "errors", "in_flight", "ok")

    def __init__(self, metrics: Metrics, method: str) -> None:
        self.in_flight = metrics.in_flight.labels(method)
        self.duration = metrics.request_duration.labels(method)
        self.ok = metrics.requests.labels(method, "ok")
        self.errors = metrics.requests.labels(method, "error")


class _Timer:
    """Counts and times one call; ``result[0]`` may be set to "error" by the body."""

    __slots__ = ("_result", "_series", "_start")

    def __init__(self, series: _Series) -> None:
        self._series = series
        self._result = ["ok"]
        self._start = 0.0

    def __enter__(self) -> list[str]:
        self._start = time.perf_counter()
        self._series.in_flight.inc()
        return self._result

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        series = self._series
        series.in_flight.dec()
        series.duration.observe(time.perf_counter() - self._start)
        ok = exc_type is None and self._result[0] == "ok"
        (series.ok if ok else series.errors).inc()


class V1Servicer(v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: DRAService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._service.prepare(request, context)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._service.unprepare(request, context)


class V1beta1Servicer(v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, service: DRAService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._service.prepare(request, context)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._service.unprepare(request, context)


def add_dra_services(server: Any, framework: PluginFramework, metrics: Metrics) -> None:
    """Register both service versions on ``server`` (one implementation behind them)."""
    v1_grpc.add_DRAPluginServicer_to_server(
        V1Servicer(DRAService(framework, v1_pb2, "v1", metrics)), server
    )
    v1beta1_grpc.add_DRAPluginServicer_to_server(
        V1beta1Servicer(DRAService(framework, v1beta1_pb2, "v1beta1", metrics)), server
    )
