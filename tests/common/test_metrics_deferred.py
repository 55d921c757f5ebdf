"""``Metrics(deferred=True)``: prometheus_client loads at ``bind()``, and every call made
before it is in the registry after it, in order; reading the registry binds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from agent import __version__
from agent.common.metrics import PENDING_MAX, ClaimDevice, Metrics


def test_calls_before_bind_are_replayed_in_order() -> None:
    m = Metrics(deferred=True)
    m.requests.labels("NodePrepareResources", "ok").inc()
    m.requests.labels("NodePrepareResources", "ok").inc(2)
    m.devices.labels(type="gpu", health="healthy").set(3)
    m.devices.clear()  # a later clear wins over the earlier set, as it would have
    m.devices.labels(type="gpu", health="healthy").set(8)
    m.discovery_duration.observe(0.02)
    m.claim_devices.set([ClaimDevice("ns", "c", "p", "gpu-0", uuid="GPU-1")])
    assert not m.bound
    r = m.registry
    assert m.bound
    assert r.get_sample_value("dra_agent_requests_total",
                              {"method": "NodePrepareResources", "result": "ok"}) == 3
    assert r.get_sample_value("dra_agent_devices", {"type": "gpu", "health": "healthy"}) == 8
    assert r.get_sample_value("dra_agent_discovery_duration_seconds_count") == 1
    assert r.get_sample_value("dra_agent_build_info", {"version": __version__}) == 1
    assert r.get_sample_value("dra_agent_claim_device_info", {
        "namespace": "ns", "claim": "c", "pool": "p", "device": "gpu-0", "UUID": "GPU-1",
        "pci_bus_id": "", "ifname": ""}) == 1
    m.requests.labels("NodePrepareResources", "ok").inc()  # bound: at once
    assert r.get_sample_value("dra_agent_requests_total",
                              {"method": "NodePrepareResources", "result": "ok"}) == 4


def test_an_object_nobody_binds_binds_itself_before_it_grows_without_end() -> None:
    m = Metrics(deferred=True)
    for _ in range(PENDING_MAX + 5):
        m.checkpoint_write_duration.observe(0.001)
    assert m.bound
    assert m.registry.get_sample_value(
        "dra_agent_checkpoint_write_duration_seconds_count") == PENDING_MAX + 5


def test_reading_a_metric_itself_binds() -> None:
    m = Metrics(deferred=True)
    m.cdi_spec_corrupt.inc(2)
    assert m.cdi_spec_corrupt._value.get() == 2  # what tests read: the real counter
    assert m.bound


def test_prometheus_client_is_not_loaded_until_bound() -> None:
    code = textwrap.dedent("""
        import sys
        from agent.common.metrics import Metrics
        m = Metrics(deferred=True)
        m.prepared_claims.set(2)
        print("prometheus_client" in sys.modules)
        m.bind()
        print("prometheus_client" in sys.modules, m.registry.get_sample_value(
            "dra_agent_prepared_claims"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["False", "True", "2.0"]


def test_claim_devices_from_a_source_render_at_the_scrape_only() -> None:
    m = Metrics()
    calls: list[int] = []

    def source() -> list[ClaimDevice]:
        calls.append(1)
        return [ClaimDevice("ns", "c", "p", "gpu-0", uuid="GPU-1"),
                ClaimDevice("ns", "c", "p", "gpu-0", uuid="GPU-1")]

    m.claim_devices.set_source(source)
    m.claim_devices.set_source(source)  # a later change replaces it: never rendered twice
    assert calls == []
    assert m.claim_devices.rows() == (("ns", "c", "p", "gpu-0", "GPU-1", "", ""),)
    assert m.claim_devices.rows() == (("ns", "c", "p", "gpu-0", "GPU-1", "", ""),)
    assert calls == [1]
    m.claim_devices.set([])
    assert m.claim_devices.rows() == ()
