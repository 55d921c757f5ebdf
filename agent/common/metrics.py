"""Prometheus metrics of the agent, prefix ``dra_agent_``.

One ``Metrics`` object per process, built on an explicit registry (tests build their own), and
handed to the components that record into it. Components accept ``metrics=None`` and then
record into a private registry, so no code path needs to check for it.

``Metrics(deferred=True)`` (the daemon's) loads prometheus_client only at ``bind()``: its
package imports its HTTP side whole (http.server, email, ssl), a quarter of the agent's start,
and the daemon answers the kubelet's registration first. Until then each metric is a
``_Pending`` that keeps the calls made on it (recovery sets the prepared-claims gauges before
the plugin serves) and replays them, in order, when bound; reading the registry binds, so what
the endpoint or a test reads is never missing a call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from agent import __version__

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
    from prometheus_client.core import Metric

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


#: Longest label value exported: a claim name (a DNS subdomain) fits whole; anything longer
#: (a hardware string from a hand-edited checkpoint) is cut, so one record cannot blow up a
#: scrape or a Prometheus ``label_value_length_limit``.
LABEL_VALUE_MAX = 253


def label_value(text: str, limit: int = LABEL_VALUE_MAX) -> str:
    """``text`` safe to show on one line: non-printable characters (newline, escape, NUL, a
    lone surrogate) become ``?`` and it is cut to ``limit`` characters. prometheus_client
    escapes quotes and newlines already; this keeps a terminal or a dashboard safe too."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One prepared device of a claim, as ``dra_agent_claim_device_info`` labels it.

    Label names are the ones the hardware exporters use, so a join needs no relabelling:
    ``UUID`` and ``pci_bus_id`` as dcgm-exporter spells them; ``ifname`` for the host
    interface (node-exporter calls it ``device``, which here is the DRA device name).
    """

    namespace: str
    claim: str
    pool: str
    device: str
    uuid: str = ""
    pci_bus_id: str = ""
    ifname: str = ""

    def labels(self) -> tuple[str, ...]:
        return tuple(label_value(v) for v in (
            self.namespace, self.claim, self.pool, self.device, self.uuid, self.pci_bus_id,
            self.ifname,
        ))


CLAIM_DEVICE_LABELS = ("namespace", "claim", "pool", "device", "UUID", "pci_bus_id", "ifname")


class ClaimDeviceInfo:
    """``dra_agent_claim_device_info``: 1 per prepared device, rebuilt whole from the
    checkpoint on every change. The rows are swapped in one assignment, so a scrape sees the
    old set or the new one, never a half-cleared gauge. A collector in prometheus_client's
    sense (``describe``, ``collect``) that needs the package only when scraped."""

    NAME = "dra_agent_claim_device_info"
    HELP = ("Devices prepared for each claim with their hardware identity (always 1), to join "
            "GPU and NIC metrics to claims.")

    def __init__(self) -> None:
        self._rows: tuple[tuple[str, ...], ...] = ()
        self._source: Callable[[], Iterable[ClaimDevice]] | None = None
        self._lock = threading.Lock()

    def set(self, devices: Iterable[ClaimDevice]) -> None:
        # dict, not set: the order stays the checkpoint's, and two rows that only differ past
        # the length limit collapse into one series instead of a duplicate Prometheus rejects.
        rows = tuple(dict.fromkeys(d.labels() for d in devices))
        with self._lock:
            self._rows, self._source = rows, None

    def set_source(self, source: Callable[[], Iterable[ClaimDevice]]) -> None:
        """The devices as ``source()`` will list them, rendered at the next scrape: every
        prepare and unprepare replaces the set, and rendering it each time cost 1 ms per call
        at 100 claims (twice per pair), for a gauge scraped every 15-60 s. ``source`` must read
        a snapshot (the caller's copy), not live state."""
        with self._lock:
            self._source = source

    def rows(self) -> tuple[tuple[str, ...], ...]:
        with self._lock:
            source, self._source = self._source, None
            if source is not None:
                self._rows = tuple(dict.fromkeys(d.labels() for d in source()))
            return self._rows

    def describe(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily(self.NAME, self.HELP, labels=CLAIM_DEVICE_LABELS)]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(self.NAME, self.HELP, labels=CLAIM_DEVICE_LABELS)
        for row in self.rows():
            family.add_metric(row, 1)
        return [family]


#: attribute -> (kind, name, help, labels). Histograms get the latency buckets.
_DEFINITIONS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    # kubelet plugin
    "requests": ("counter", "dra_agent_requests",
                 "gRPC calls by method and result (ok, error).", ("method", "result")),
    "request_duration": ("histogram", "dra_agent_request_duration_seconds",
                         "gRPC call duration by method.", ("method",)),
    "in_flight": ("gauge", "dra_agent_requests_in_flight", "gRPC calls being served.",
                  ("method",)),
    "claim_errors": ("counter", "dra_agent_claim_errors",
                     "Per-claim prepare/unprepare errors by operation and reason.",
                     ("operation", "reason")),
    "prepared_claims": ("gauge", "dra_agent_prepared_claims", "Claims prepared on this node.",
                        ()),
    "prepared_devices": ("gauge", "dra_agent_prepared_devices",
                         "Devices prepared on this node.", ()),
    "claim_status_errors": ("counter", "dra_agent_claim_status_errors",
                            "Failed writes of claim status.devices.", ()),
    # checkpoint
    "checkpoint_write_duration": ("histogram", "dra_agent_checkpoint_write_duration_seconds",
                                  "Durable checkpoint write duration.", ()),
    "checkpoint_corrupt": ("counter", "dra_agent_checkpoint_corrupt",
                           "Checkpoint files found corrupt and set aside.", ()),
    "cdi_spec_corrupt": ("counter", "dra_agent_cdi_spec_corrupt",
                         "CDI spec files of ours found unreadable at start-up and set aside.",
                         ()),
    "specs_rebuilt": ("counter", "dra_agent_cdi_specs_rebuilt",
                      "CDI specs of prepared claims rewritten at start-up (reboot or lost file).",
                      ()),
    "spec_rebuild_errors": ("counter", "dra_agent_cdi_spec_rebuild_errors",
                            "Prepared claims whose CDI spec could not be rebuilt at start-up, by "
                            "reason (unknown_device: a device of the claim is gone).",
                            ("reason",)),
    # discovery and health
    "devices": ("gauge", "dra_agent_devices", "Discovered devices by type and health.",
                ("type", "health")),
    "discovery_duration": ("histogram", "dra_agent_discovery_duration_seconds",
                           "Duration of one full discovery.", ()),
    "health_events": ("counter", "dra_agent_health_events", "Device health events by kind.",
                      ("kind",)),
    # ResourceSlice controller
    "slice_writes": ("counter", "dra_agent_resourceslice_writes",
                     "ResourceSlice API writes by verb and result.", ("verb", "result")),
    "slice_errors": ("counter", "dra_agent_resourceslice_errors",
                     "ResourceSlice publishing errors by reason.", ("reason",)),
    "last_publish": ("gauge", "dra_agent_last_successful_publish_timestamp_seconds",
                     "Unix time when all pools were last in sync with the API server.", ()),
    "build_info": ("info", "dra_agent_build", "Build information.", ()),
}

#: What a ``_Pending`` keeps; any other attribute binds the metrics and reads the real one.
_RECORDED = frozenset({"inc", "dec", "set", "observe", "clear", "info"})
#: Calls kept before ``bind()`` at most: past this a deferred ``Metrics`` binds itself, so an
#: object nobody binds (a part built alone, with its own) never grows without end.
PENDING_MAX = 10_000


class _Pending:
    """A metric (or a ``labels()`` child of one) of an unbound ``Metrics``."""

    __slots__ = ("_attr", "_owner", "_path")

    def __init__(self, owner: Metrics, attr: str,
                 path: tuple[tuple[tuple[Any, ...], dict[str, Any]], ...] = ()) -> None:
        self._owner, self._attr, self._path = owner, attr, path

    def labels(self, *args: Any, **kwargs: Any) -> _Pending:
        return _Pending(self._owner, self._attr, (*self._path, (args, kwargs)))

    def __getattr__(self, method: str) -> Any:
        if method not in _RECORDED:  # a test reading ``_value``: the real one, bound
            return getattr(self._owner.resolve(self._attr, self._path), method)

        def record(*args: Any, **kwargs: Any) -> None:
            self._owner.record(self._attr, self._path, method, args, kwargs)
        return record


class Metrics:
    """Every metric of the agent, as attributes (``metrics.requests.labels(m, r).inc()``)."""

    requests: Counter
    request_duration: Histogram
    in_flight: Gauge
    claim_errors: Counter
    prepared_claims: Gauge
    prepared_devices: Gauge
    claim_status_errors: Counter
    checkpoint_write_duration: Histogram
    checkpoint_corrupt: Counter
    cdi_spec_corrupt: Counter
    specs_rebuilt: Counter
    spec_rebuild_errors: Counter
    devices: Gauge
    discovery_duration: Histogram
    health_events: Counter
    slice_writes: Counter
    slice_errors: Counter
    last_publish: Gauge
    build_info: Info

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 deferred: bool = False) -> None:
        self.claim_devices = ClaimDeviceInfo()
        self._lock = threading.Lock()
        self._registry = registry
        self._pending: list[tuple[str, tuple[Any, ...], str, tuple[Any, ...],
                                  dict[str, Any]]] | None = []
        for attr in _DEFINITIONS:
            setattr(self, attr, _Pending(self, attr))
        self.build_info.info({"version": __version__})
        if not deferred:
            self.bind()

    @property
    def bound(self) -> bool:
        return self._pending is None

    @property
    def registry(self) -> CollectorRegistry:
        """The registry every metric is in; bound first, with every call made so far."""
        self.bind()
        assert self._registry is not None
        return self._registry

    def bind(self) -> None:
        """Load prometheus_client, make the real metrics and replay the calls kept so far."""
        with self._lock:
            if self._pending is None:
                return
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

            registry = self._registry = self._registry or CollectorRegistry()
            kinds: dict[str, Any] = {"counter": Counter, "gauge": Gauge, "info": Info,
                                     "histogram": Histogram}
            for attr, (kind, name, text, labels) in _DEFINITIONS.items():
                extra = {"buckets": _LATENCY_BUCKETS} if kind == "histogram" else {}
                setattr(self, attr, kinds[kind](name, text, labels, registry=registry, **extra))
            registry.register(cast(Any, self.claim_devices))
            pending, self._pending = self._pending, None
            for attr, path, method, args, kwargs in pending:
                self._apply(attr, path, method, args, kwargs)

    def record(self, attr: str, path: tuple[Any, ...], method: str, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        """A call on a ``_Pending``: kept until bound, made at once after."""
        with self._lock:
            if self._pending is not None and len(self._pending) < PENDING_MAX:
                self._pending.append((attr, path, method, args, kwargs))
                return
        self.bind()
        self._apply(attr, path, method, args, kwargs)

    def resolve(self, attr: str, path: tuple[Any, ...]) -> Any:
        """The bound metric (or ``labels()`` child) that a ``_Pending`` stands for."""
        self.bind()
        return self._real(attr, path)

    def _real(self, attr: str, path: tuple[Any, ...]) -> Any:
        metric = getattr(self, attr)
        for args, kwargs in path:
            metric = metric.labels(*args, **kwargs)
        return metric

    def _apply(self, attr: str, path: tuple[Any, ...], method: str, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        """Once bound (``bind`` replays under its lock, so never through ``resolve``)."""
        getattr(self._real(attr, path), method)(*args, **kwargs)
