"""Claim status for NICs: ``status.devices`` written through the fake API server's /status,
never failing a prepare."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.claim.status import ClaimStatusWriter, NicStatus, device_entries, up_to_date
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.plugin import APIClaimSource, PluginServer
from discovery.model import Device, DeviceType, HostInfo, Inventory
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn
from tests.plugnode import DRIVER, NODE, NodeEdits, build_node, gpu, make_claim, ref

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig"}
T0 = "2026-01-01T00:00:00Z"


def nic(i: int) -> Device:
    return Device(f"nic-{i}", DeviceType.NIC, {"macAddress": f"b8:3f:d2:00:00:0{i}"}, {},
                  HostInfo(pci_address=f"0000:3{i}:00.0", if_name=f"ens{i}"))


def status_devices(srv: FakeAPIServer, name: str) -> list[dict[str, Any]]:
    claim = srv.get_object("resourceclaims", name, "default")
    assert claim is not None
    return list((claim.get("status") or {}).get("devices") or [])


def status_writes(srv: FakeAPIServer) -> list[Any]:
    return [r for r in srv.requests if r.path.endswith("/status") and r.verb == "patch"]


@dataclass
class Agent:
    srv: FakeAPIServer
    server: PluginServer
    kubelet: KubeletStandIn
    metrics: Metrics

    def prepare(self, claim: dict[str, Any]) -> Any:
        """One prepare, and the status write it queued (made after the answer) done."""
        result = self.kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
        assert self.server.framework.settle(10)
        return result

    @property
    def errors(self) -> float:
        value = self.metrics.registry.get_sample_value("dra_agent_claim_status_errors_total")
        return value or 0.0


@pytest.fixture
def agent(short_root: Path) -> Iterator[Agent]:
    n = build_node(short_root)  # for its options and directories only
    n.kubelet.stop()
    n.server.stop(0)
    metrics = Metrics()
    with FakeAPIServer() as srv:
        server = plugin_server(
            n.options, n.prepare_options,
            lambda: Inventory(devices=(gpu(0), nic(0), nic(1))), NodeEdits(),
            APIClaimSource(srv.kube()), metrics=metrics,
        )
        server.start()
        try:
            with KubeletStandIn(n.options.kubelet_dir / "plugins_registry") as kubelet:
                kubelet.wait_registered(DRIVER)
                yield Agent(srv, server, kubelet, metrics)
        finally:
            server.stop(0)


def test_prepared_nics_appear_in_the_claim_status(agent: Agent) -> None:
    config = [{"source": "FromClaim", "requests": ["req"], "opaque": {
        "driver": DRIVER, "parameters": {**GOOD, "netdev": {"move": True,
                                                            "interfaceName": "net1"}}}}]
    claim = agent.srv.put_object(make_claim("net", ["nic-0"], config=config))
    assert agent.prepare(claim).ok
    (entry,) = status_devices(agent.srv, "net")
    assert {k: entry[k] for k in ("driver", "pool", "device")} == {
        "driver": DRIVER, "pool": NODE, "device": "nic-0"}
    assert entry["networkData"] == {"interfaceName": "net1",
                                    "hardwareAddress": "b8:3f:d2:00:00:00"}
    (ready,) = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert ready["lastTransitionTime"].endswith("Z") and ready["message"]
    assert ready.get("observedGeneration") == claim["metadata"].get("generation")
    (write,) = status_writes(agent.srv)
    assert write.query.get("fieldManager") == DRIVER and write.query.get("force") == "true"


def test_the_answer_does_not_wait_for_the_status_write(agent: Agent) -> None:
    writer = agent.server.framework.status
    assert isinstance(writer, ClaimStatusWriter)
    opened = threading.Event()

    class Gated:
        def report(self, claim: Any, nics: Any) -> bool:
            assert opened.wait(10)
            return writer.report(claim, nics)

    agent.server.framework.status = Gated()
    claim = agent.srv.put_object(make_claim("net", ["nic-0"]))
    # The write cannot be made before ``opened``: the answer came without it.
    assert agent.kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok
    assert status_writes(agent.srv) == []
    opened.set()
    assert agent.server.framework.settle(10)
    assert [e["device"] for e in status_devices(agent.srv, "net")] == ["nic-0"]


def test_repeated_prepare_writes_nothing_new(agent: Agent) -> None:
    claim = agent.srv.put_object(make_claim("net", ["nic-0", "nic-1"]))
    assert agent.prepare(claim).ok
    first = status_devices(agent.srv, "net")
    assert [e["networkData"]["interfaceName"] for e in first] == ["ens0", "ens1"]  # not moved
    assert agent.prepare(claim).ok  # a second pod, or the kubelet after a restart
    assert len(status_writes(agent.srv)) == 1
    assert status_devices(agent.srv, "net") == first


def test_gpu_only_claims_cause_no_status_write(agent: Agent) -> None:
    claim = agent.srv.put_object(make_claim("gpu", ["gpu-0"]))
    assert agent.prepare(claim).ok
    assert status_writes(agent.srv) == [] and status_devices(agent.srv, "gpu") == []


def test_forbidden_status_write_does_not_fail_prepare_and_logs_once(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    claims = [agent.srv.put_object(make_claim(f"net{i}", [f"nic-{i}"])) for i in range(2)]
    agent.srv.fail_next(2, 403, verb="patch", path_contains="/status")
    with caplog.at_level(logging.DEBUG, logger="agent.claim.status"):
        assert all(agent.prepare(c).ok for c in claims)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "resourceclaims/status" in warnings[0].getMessage()
    assert agent.errors == 2
    assert status_devices(agent.srv, "net0") == []


def test_server_error_on_status_is_logged_with_claim_and_device_and_retried_next_time(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    claim = agent.srv.put_object(make_claim("net", ["nic-1"]))
    agent.srv.fail_next(1, 500, verb="patch", path_contains="/status")
    with caplog.at_level(logging.WARNING, logger="agent.claim.status"):
        assert agent.prepare(claim).ok
    (record,) = caplog.records
    fields = record.__dict__
    assert fields["devices"] == "nic-1" and fields["status"] == 500
    assert claim["metadata"]["uid"] in fields["claim"]
    assert agent.errors == 1
    assert agent.prepare(claim).ok  # the repeat sees no status yet and writes it
    assert [e["device"] for e in status_devices(agent.srv, "net")] == ["nic-1"]


def test_api_server_gone_after_the_get_does_not_fail_prepare(agent: Agent) -> None:
    claim = agent.srv.put_object(make_claim("net", ["nic-0"]))
    agent.srv.delay(0.3, verb="patch", path_contains="/status")
    writer = agent.server.framework.status
    assert isinstance(writer, ClaimStatusWriter)
    writer.timeout_s = 0.05  # the answer comes too late: a timeout, not an exception out
    assert agent.prepare(claim).ok
    assert agent.errors == 1


def test_older_server_gets_the_status_in_its_version() -> None:
    with FakeAPIServer(served_resource_versions=("v1beta1",)) as srv:
        claim = srv.put_object(make_claim("net", ["nic-0"]))
        fetched = srv.get_object("resourceclaims", "net", "default", version="v1beta1")
        assert fetched is not None
        fetched = {**fetched, "apiVersion": "resource.k8s.io/v1"}  # read with a newer client
        writer = ClaimStatusWriter(srv.kube(), DRIVER, NODE)
        assert writer.report(fetched, [NicStatus(NODE, "nic-0", interface_name="ens0")])
        assert status_devices(srv, "net")[0]["networkData"] == {"interfaceName": "ens0"}
        assert claim["metadata"]["uid"]


def test_entries_keep_the_transition_time_and_compare_equal() -> None:
    claim = make_claim("net", ["nic-0"])
    claim["metadata"]["generation"] = 3
    nics = [NicStatus(NODE, "nic-0", share_id="s1", interface_name="net1",
                      hardware_address="b8:3f:d2:00:00:00")]
    (entry,) = device_entries(claim, DRIVER, NODE, nics, now=lambda: T0)
    assert entry["shareID"] == "s1" and entry["conditions"][0]["observedGeneration"] == 3
    assert not up_to_date(claim, [entry])
    claim["status"]["devices"] = [entry, {"driver": "other.io", "pool": "p", "device": "d"}]
    (again,) = device_entries(claim, DRIVER, NODE, nics, now=lambda: "2027-01-01T00:00:00Z")
    assert again["conditions"][0]["lastTransitionTime"] == T0
    assert up_to_date(claim, [again])
    moved = [NicStatus(NODE, "nic-0", share_id="s1", interface_name="net2")]
    assert not up_to_date(claim, device_entries(claim, DRIVER, NODE, moved, now=lambda: T0))


def test_a_reporter_that_raises_never_fails_the_prepare(short_root: Path) -> None:
    class Broken:
        def report(self, claim: Any, nics: Any) -> bool:
            raise RuntimeError("bug")

    n = build_node(short_root)
    try:
        n.server.framework.status = Broken()
        claim = n.book.put(make_claim("net", ["nic-0"]))
        assert n.prepare(claim)[claim["metadata"]["uid"]].ok
        assert n.server.framework.settle(10)
        assert n.metrics.registry.get_sample_value("dra_agent_claim_status_errors_total") == 1
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def claim_gets(srv: FakeAPIServer) -> list[Any]:
    return [r for r in srv.requests if r.verb == "get" and "/resourceclaims/" in r.path]


def test_repeat_of_a_reported_claim_reads_nothing(agent: Agent) -> None:
    nics = agent.srv.put_object(make_claim("net", ["nic-0"]))
    gpus = agent.srv.put_object(make_claim("gpu", ["gpu-0"]))
    assert agent.prepare(nics).ok and agent.prepare(gpus).ok
    agent.srv.clear_requests()
    # Both answered from the checkpoint: the NICs are reported already, the GPU has none.
    assert agent.prepare(nics).ok and agent.prepare(gpus).ok
    assert claim_gets(agent.srv) == [] and status_writes(agent.srv) == []


def test_report_owed_while_the_api_server_is_down_does_not_fail_the_repeat(
    agent: Agent,
) -> None:
    claim = agent.srv.put_object(make_claim("net", ["nic-0"]))
    agent.srv.fail_next(1, 500, verb="patch", path_contains="/status")
    assert agent.prepare(claim).ok  # prepared; the report failed and is owed
    agent.srv.stop()
    assert agent.prepare(claim).ok  # the checkpoint answers; the report waits
    agent.srv.start()
    assert agent.prepare(claim).ok
    assert [e["device"] for e in status_devices(agent.srv, "net")] == ["nic-0"]


#: What kube-apiserver 1.37.2 answered a status.devices apply without resourceclaims/driver
#: permission (recorded by tests/realk8s/test_daemonset_identity.py): 422, not 403.
GRANULAR_REFUSAL = json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": 'ResourceClaim.resource.k8s.io "nic" is invalid: status.devices: Forbidden: '
               'changing status.devices requires resource="resourceclaims/driver", ...',
    "details": {"name": "nic", "group": "resource.k8s.io", "kind": "ResourceClaim", "causes": [
        {"reason": "FieldValueForbidden", "field": "status.devices",
         "message": 'Forbidden: changing status.devices requires resource='
                    '"resourceclaims/driver", verb="[associated-node:patch '
                    'arbitrary-node:patch]" permission'}]},
}).encode()


def test_granular_status_refusal_counts_as_forbidden() -> None:
    from agent.claim.status import ClaimStatusWriter

    assert ClaimStatusWriter._forbidden_field(422, GRANULAR_REFUSAL)
    other = GRANULAR_REFUSAL.replace(b"FieldValueForbidden", b"FieldValueInvalid")
    assert not ClaimStatusWriter._forbidden_field(422, other)
    assert not ClaimStatusWriter._forbidden_field(500, GRANULAR_REFUSAL)
    assert not ClaimStatusWriter._forbidden_field(422, b"not json")


def test_after_a_refusal_for_permission_writes_rest_then_resume() -> None:
    """A 403 is the identity's: the next claims' writes are counted, not sent, for the hold;
    then one is sent again, and once allowed the writes go on (the skipped claim's next
    prepare writes it)."""
    clock = [100.0]
    metrics = Metrics()
    with FakeAPIServer() as srv:
        claims = [srv.put_object(make_claim(f"net{i}", [f"nic-{i}"])) for i in range(3)]
        writer = ClaimStatusWriter(srv.kube(), DRIVER, NODE, metrics=metrics,
                                   forbidden_hold_s=30.0, clock=lambda: clock[0])

        def report(i: int) -> bool:
            return writer.report(claims[i], [NicStatus(NODE, f"nic-{i}")])

        srv.fail_next(1, 403, verb="patch", path_contains="/status")
        assert not report(0)
        clock[0] += 29.0
        assert not report(1)  # skipped: no request
        assert len(status_writes(srv)) == 1
        assert metrics.registry.get_sample_value("dra_agent_claim_status_errors_total") == 2
        clock[0] += 1.0
        assert report(1) and report(2) and report(0)
        assert len(status_writes(srv)) == 4
        assert [status_devices(srv, f"net{i}")[0]["device"] for i in range(3)] == [
            "nic-0", "nic-1", "nic-2"]


def test_a_server_error_does_not_hold_the_writes() -> None:
    with FakeAPIServer() as srv:
        claims = [srv.put_object(make_claim(f"net{i}", [f"nic-{i}"])) for i in range(2)]
        writer = ClaimStatusWriter(srv.kube(), DRIVER, NODE, clock=lambda: 0.0)
        srv.fail_next(1, 500, verb="patch", path_contains="/status")
        assert not writer.report(claims[0], [NicStatus(NODE, "nic-0")])
        assert writer.report(claims[1], [NicStatus(NODE, "nic-1")])
