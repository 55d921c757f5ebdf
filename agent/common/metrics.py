"""Prometheus metrics of the agent, prefix ``dra_agent_``.

One ``Metrics`` object per process, built on an explicit registry (tests build their own), and
handed to the components that record into it. Components accept ``metrics=None`` and then
record into a private registry, so no code path needs to check for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import __version__

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


class ClaimDeviceInfo(Collector):
    """``dra_agent_claim_device_info``: 1 per prepared device, rebuilt whole from the
    checkpoint on every change. The rows are swapped in one assignment, so a scrape sees the
    old set or the new one, never a half-cleared gauge."""

    NAME = "dra_agent_claim_device_info"
    HELP = ("Devices prepared for each claim with their hardware identity (always 1), to join "
            "GPU and NIC metrics to claims.")

    def __init__(self) -> None:
        self._rows: tuple[tuple[str, ...], ...] = ()

    def set(self, devices: Iterable[ClaimDevice]) -> None:
        # dict, not set: the order stays the checkpoint's, and two rows that only differ past
        # the length limit collapse into one series instead of a duplicate Prometheus rejects.
        self._rows = tuple(dict.fromkeys(d.labels() for d in devices))

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=CLAIM_DEVICE_LABELS)]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=CLAIM_DEVICE_LABELS)
        for row in self._rows:
            family.add_metric(row, 1)
        return [family]


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        # kubelet plugin
        self.requests = Counter(
            "dra_agent_requests", "gRPC calls by method and result (ok, error).",
            ["method", "result"], registry=r,
        )
        self.request_duration = Histogram(
            "dra_agent_request_duration_seconds", "gRPC call duration by method.",
            ["method"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(
            "dra_agent_requests_in_flight", "gRPC calls being served.", ["method"], registry=r
        )
        self.claim_errors = Counter(
            "dra_agent_claim_errors", "Per-claim prepare/unprepare errors by operation and reason.",
            ["operation", "reason"], registry=r,
        )
        self.prepared_claims = Gauge(
            "dra_agent_prepared_claims", "Claims prepared on this node.", registry=r
        )
        self.prepared_devices = Gauge(
            "dra_agent_prepared_devices", "Devices prepared on this node.", registry=r
        )
        self.claim_devices = ClaimDeviceInfo()
        r.register(self.claim_devices)
        self.claim_status_errors = Counter(
            "dra_agent_claim_status_errors", "Failed writes of claim status.devices.", registry=r
        )
        # checkpoint
        self.checkpoint_write_duration = Histogram(
            "dra_agent_checkpoint_write_duration_seconds", "Durable checkpoint write duration.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.checkpoint_corrupt = Counter(
            "dra_agent_checkpoint_corrupt", "Checkpoint files found corrupt and set aside.",
            registry=r,
        )
        self.cdi_spec_corrupt = Counter(
            "dra_agent_cdi_spec_corrupt",
            "CDI spec files of ours found unreadable at start-up and set aside.", registry=r,
        )
        self.specs_rebuilt = Counter(
            "dra_agent_cdi_specs_rebuilt",
            "CDI specs of prepared claims rewritten at start-up (reboot or lost file).",
            registry=r,
        )
        self.spec_rebuild_errors = Counter(
            "dra_agent_cdi_spec_rebuild_errors",
            "Prepared claims whose CDI spec could not be rebuilt at start-up, by reason "
            "(unknown_device: a device of the claim is gone).",
            ["reason"], registry=r,
        )
        # discovery and health
        self.devices = Gauge(
            "dra_agent_devices", "Discovered devices by type and health.",
            ["type", "health"], registry=r,
        )
        self.discovery_duration = Histogram(
            "dra_agent_discovery_duration_seconds", "Duration of one full discovery.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.health_events = Counter(
            "dra_agent_health_events", "Device health events by kind.", ["kind"], registry=r
        )
        # ResourceSlice controller
        self.slice_writes = Counter(
            "dra_agent_resourceslice_writes", "ResourceSlice API writes by verb and result.",
            ["verb", "result"], registry=r,
        )
        self.slice_errors = Counter(
            "dra_agent_resourceslice_errors", "ResourceSlice publishing errors by reason.",
            ["reason"], registry=r,
        )
        self.last_publish = Gauge(
            "dra_agent_last_successful_publish_timestamp_seconds",
            "Unix time when all pools were last in sync with the API server.", registry=r,
        )
        self.build_info = Info("dra_agent_build", "Build information.", registry=r)
        self.build_info.info({"version": __version__})
