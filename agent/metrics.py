"""Prometheus metrics of the agent, prefix ``dra_agent_``.

One ``Metrics`` object per process, built on an explicit registry (tests build their own), and
handed to the components that record into it. Components accept ``metrics=None`` and then
record into a private registry, so no code path needs to check for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from agent import __version__

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


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
