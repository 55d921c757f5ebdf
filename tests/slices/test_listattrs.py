"""numaNode's form in the published slices: the list where the API server keeps list
attributes (DRAListTypeAttributes on), the scalar otherwise, decided by one dry-run probe per
controller start, or by the operator; and the controller settles on either."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kube.transport import as_kubehttp
from agent.slices import ApiError, KubeSliceClient, Owner, RejectedSliceError
from agent.slices.listattrs import probe_object, server_takes_lists
from discovery.model import NUMA_NODE, Device, DeviceType, DriverResources, Inventory
from discovery.pools import build_resources
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.conftest import WRITE_VERBS, Harness, our_slices, writes
from tests.slices.helpers import DRIVER, NODE, node
from tests.waiting import wait_for

LISTS_ON = {"DRAListTypeAttributes": True}


def inventory(count: int = 3) -> Inventory:
    return Inventory(devices=tuple(
        Device(f"gpu-{i}", DeviceType.GPU, {NUMA_NODE: (i % 2, i % 2 + 2), "index": i},
               {"memory": "80Gi"})
        for i in range(count)))


def hardware(count: int = 3) -> DriverResources:
    return build_resources(inventory(count), NODE)


def numa_values(srv: FakeAPIServer) -> list[Any]:
    return [d["attributes"].get(NUMA_NODE) for o in our_slices(srv)
            for d in o["spec"].get("devices", [])]


def probes(srv: FakeAPIServer) -> list[Any]:
    return [r for r in srv.requests if r.query.get("dryRun") == "All"]


def real_writes(srv: FakeAPIServer) -> list[tuple[str, str, int]]:
    """Writes that stored something (the probe is a dry run)."""
    return [(r.verb, r.path, r.status) for r in srv.requests
            if r.verb in WRITE_VERBS and r.query.get("dryRun") != "All"]


@pytest.fixture
def lists_srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.5, feature_gates=LISTS_ON) as server:
        server.put_object(node())
        yield server


def settle_without_writes(srv: FakeAPIServer, controller: Any) -> None:
    """Nothing is written once in sync: not after a resync, not after the same update."""
    srv.clear_requests()
    controller.update(hardware())
    assert controller.synced(10)
    time.sleep(0.4)
    assert writes(srv) == []


def test_gate_on_publishes_the_list_and_settles(lists_srv: FakeAPIServer,
                                                harness: Harness) -> None:
    c = harness.start(lists_srv, hardware())
    assert c.synced(10)
    assert c.list_attributes is True
    assert numa_values(lists_srv) == [{"ints": [0, 2]}, {"ints": [1, 3]}, {"ints": [0, 2]}]
    assert len(probes(lists_srv)) == 1
    assert len(our_slices(lists_srv)) == 1  # the dry run stored nothing
    settle_without_writes(lists_srv, c)
    assert probes(lists_srv) == []  # once per start


def test_gate_off_publishes_the_scalar_and_settles(srv: FakeAPIServer, harness: Harness,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agent.slices"):
        c = harness.start(srv, hardware())
        assert c.synced(10)
    assert c.list_attributes is False
    assert numa_values(srv) == [{"int": 0}, {"int": 1}, {"int": 0}]
    assert [r.status for r in probes(srv)] == [422]  # dropped, then value-less: refused
    said = [r.getMessage() for r in caplog.records if "list attributes" in r.getMessage()]
    assert len(said) == 1 and "DRAListTypeAttributes off" in said[0]
    assert harness.errors == []  # the probe's 422 is an answer, not an error
    settle_without_writes(srv, c)


def test_restart_on_the_same_server_adopts_the_list_slices_with_zero_writes(
        lists_srv: FakeAPIServer, harness: Harness) -> None:
    first = harness.start(lists_srv, hardware(130))
    assert first.synced(10)
    assert [len(o["spec"]["devices"]) for o in our_slices(lists_srv)] == [64, 64, 2]
    first.stop()
    lists_srv.clear_requests()
    second = harness.start(lists_srv, hardware(130))
    assert second.synced(10)
    time.sleep(0.3)
    assert real_writes(lists_srv) == [] and len(probes(lists_srv)) == 1


def test_scalar_form_keeps_128_devices_per_slice(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, hardware(130))
    assert c.synced(10)
    assert sorted(len(o["spec"]["devices"]) for o in our_slices(srv)) == [2, 128]


def test_a_v1beta1_server_is_probed_and_served_in_its_own_shape(harness: Harness) -> None:
    with FakeAPIServer(("v1beta1",), bookmark_interval=0.5, feature_gates=LISTS_ON) as server:
        server.put_object(node())
        c = harness.start(server, hardware(1))
        assert c.synced(10)
        assert c.api_version == "v1beta1" and c.list_attributes is True
        (obj,) = our_slices(server, "v1beta1")
        assert obj["spec"]["devices"][0]["basic"]["attributes"][NUMA_NODE] == {"ints": [0, 2]}
        c.stop()


@pytest.mark.parametrize(("choice", "expected"), [(True, {"ints": [0, 2]}), (False, {"int": 0})])
def test_the_operator_override_skips_the_probe(lists_srv: FakeAPIServer, harness: Harness,
                                               choice: bool, expected: Any) -> None:
    c = harness.start(lists_srv, hardware(1), list_attributes=choice)
    assert c.synced(10)
    assert numa_values(lists_srv) == [expected]
    assert probes(lists_srv) == []


def test_forcing_the_list_on_a_server_without_it_is_one_rejection(
        srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, hardware(1), list_attributes=True)
    wait_for(lambda: harness.errors_of(RejectedSliceError), what="the 422 reported")
    assert not c.synced(0.3)
    (err,) = harness.errors_of(RejectedSliceError)
    assert NUMA_NODE in str(err)


def test_resources_without_lists_send_no_probe(srv: FakeAPIServer, harness: Harness) -> None:
    plain = build_resources(Inventory(devices=(
        Device("nic-0", DeviceType.NIC, {"ifName": "eth0"}, {}),)), NODE)
    assert plain.list_pools is None
    c = harness.start(srv, plain)
    assert c.synced(10)
    assert probes(srv) == [] and c.list_attributes is None


# -- the probe on its own: every failure is the scalar and one line -------------------------


def probe(client: Any, caplog: pytest.LogCaptureFixture) -> tuple[bool, list[str]]:
    with caplog.at_level(logging.INFO, logger="agent.slices"):
        answer = server_takes_lists(client, DRIVER, Owner(name=NODE), "v1")
    lines = [f"{r.levelname} {r.getMessage()} {getattr(r, 'error', '')}" for r in caplog.records
             if r.name == "agent.slices"]
    return answer, lines


def test_probe_answered_500_is_the_scalar_and_one_line(srv: FakeAPIServer,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    srv.fail_next(1, 500, verb="create")
    answer, lines = probe(KubeSliceClient(srv.kube()), caplog)
    assert answer is False
    assert len(lines) == 1 and lines[0].startswith("WARNING list attribute probe failed")
    assert "InternalError" in lines[0]


class _Html(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"<html><body>Welcome to nginx!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_probe_answered_with_html_is_the_scalar_and_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    from kubernetes import client as k8s

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = k8s.Configuration()
        config.host = f"http://127.0.0.1:{server.server_address[1]}"
        answer, lines = probe(KubeSliceClient(as_kubehttp(k8s.ApiClient(config))), caplog)
    finally:
        server.shutdown()
        server.server_close()
    assert answer is False
    assert len(lines) == 1 and "probe failed" in lines[0] and "not JSON" in lines[0]


def test_probe_of_a_server_that_is_down_is_the_scalar_and_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    from kubernetes import client as k8s

    config = k8s.Configuration()
    config.host = "http://127.0.0.1:9"  # discard port: nothing listens
    answer, lines = probe(KubeSliceClient(as_kubehttp(k8s.ApiClient(config))), caplog)
    assert answer is False and len(lines) == 1 and "probe failed" in lines[0]


@pytest.mark.parametrize("answer", [[], {"spec": "x"}, {"spec": {"devices": []}}, "ok", None])
def test_probe_answered_with_something_else_is_the_scalar(
        answer: Any, caplog: pytest.LogCaptureFixture) -> None:
    class Odd:
        def dry_run_create(self, version: str, obj: Any) -> Any:
            return answer

    result, lines = probe(Odd(), caplog)
    assert result is False and len(lines) == 1


def test_a_client_without_dry_run_gets_the_scalar(caplog: pytest.LogCaptureFixture) -> None:
    result, lines = probe(object(), caplog)
    assert result is False and len(lines) == 1


def test_probe_object_passes_our_own_validation_with_the_gate_on() -> None:
    obj = probe_object(DRIVER, Owner(name=NODE), "v1")
    assert obj["spec"]["nodeName"] == NODE and obj["spec"]["pool"]["name"] == NODE
    assert obj["spec"]["driver"] == DRIVER
    other = probe_object(DRIVER, Owner(kind="Deployment", name="fabric", uid="u1"), "v1")
    assert other["spec"]["allNodes"] is True and "nodeName" not in other["spec"]


def test_a_422_about_something_else_is_the_scalar_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    from agent.kube.errors import Cause

    class Refusing:
        def dry_run_create(self, version: str, obj: Any) -> Any:
            raise ApiError("POST", "/apis/resource.k8s.io/v1/resourceslices", 422, "Invalid",
                           "denied by policy", causes=[Cause("spec.pool.name", "x", "no")])

    result, lines = probe(Refusing(), caplog)
    assert result is False and len(lines) == 1
    assert lines[0].startswith("WARNING list attribute probe failed") and "policy" in lines[0]
