"""The metrics/health listener over real HTTP, as Prometheus and the kubelet's probes use it."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.common.metrics import Metrics
from agent.httpserver import HealthServer, HealthServerError, parse_address


def _get(
    server: HealthServer, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


class Flag:
    """A check whose answer the test flips."""

    def __init__(self, ok: bool, reason: str) -> None:
        self.ok, self.reason = ok, reason

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def server(metrics: Metrics) -> Iterator[HealthServer]:
    with HealthServer("127.0.0.1:0", metrics.registry) as srv:
        yield srv


def test_metrics_exposes_the_given_registry(server: HealthServer, metrics: Metrics) -> None:
    metrics.requests.labels(method="NodePrepareResources", result="ok").inc(3)
    status, headers, body = _get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert 'dra_agent_requests_total{method="NodePrepareResources",result="ok"} 3.0' in text
    assert "dra_agent_build_info{" in text


def test_metrics_only_from_that_registry() -> None:
    # The process-wide default registry (python_gc_*, process_*) must not leak in.
    with HealthServer("127.0.0.1:0", CollectorRegistry()) as srv:
        status, _, body = _get(srv, "/metrics")
    assert status == 200
    assert b"python_gc" not in body


def test_metrics_openmetrics_and_gzip_on_request(server: HealthServer) -> None:
    status, headers, body = _get(
        server,
        "/metrics",
        {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body).rstrip().endswith(b"# EOF")


def test_healthz_200_lists_every_check() -> None:
    checks = {"plugin-sockets": Flag(True, ""), "threads": Flag(True, "4 alive")}
    with HealthServer("127.0.0.1:0", CollectorRegistry(), checks) as srv:
        status, headers, body = _get(srv, "/healthz")
    assert status == 200
    assert headers["Cache-Control"] == "no-store"
    assert body.decode().splitlines() == [
        "[+]plugin-sockets ok",
        "[+]threads ok: 4 alive",
        "healthz check passed",
    ]


def test_healthz_503_names_the_failing_check_and_its_reason() -> None:
    threads = Flag(True, "")
    checks = {"plugin-sockets": Flag(True, ""), "threads": threads}
    with HealthServer("127.0.0.1:0", CollectorRegistry(), checks) as srv:
        threads.ok, threads.reason = False, "slice controller thread died:\nConnectionError"
        status, _, body = _get(srv, "/healthz")
        assert status == 503
        assert body.decode().splitlines() == [
            "[+]plugin-sockets ok",
            "[-]threads failed: slice controller thread died: ConnectionError",
            "healthz check failed",
        ]
        threads.ok = True
        assert _get(srv, "/healthz")[0] == 200


def test_readyz_includes_liveness_and_readiness_checks() -> None:
    published = Flag(False, "slices not yet published")
    with HealthServer(
        "127.0.0.1:0", CollectorRegistry(), {"alive": Flag(True, "")}, {"published": published}
    ) as srv:
        assert _get(srv, "/healthz")[0] == 200  # readiness does not affect liveness
        status, _, body = _get(srv, "/readyz")
        assert status == 503
        assert body.decode().splitlines() == [
            "[+]alive ok",
            "[-]published failed: slices not yet published",
            "readyz check failed",
        ]
        published.ok = True
        assert _get(srv, "/readyz")[0] == 200


def test_checks_added_after_start_are_served(server: HealthServer) -> None:
    assert _get(server, "/readyz")[0] == 200  # no checks: trivially passing
    server.add_ready_check("registered", Flag(False, "kubelet has not called GetInfo"))
    assert _get(server, "/readyz")[0] == 503
    assert _get(server, "/healthz")[0] == 200
    server.add_check("threads", Flag(False, "dead"))
    assert _get(server, "/healthz")[0] == 503


def test_single_check_endpoint_and_unknown_check(server: HealthServer) -> None:
    server.add_check("a", Flag(True, ""))
    server.add_check("b", Flag(False, "broken"))
    status, _, body = _get(server, "/healthz/a")
    assert (status, body) == (200, b"[+]a ok\nhealthz check passed\n")
    assert _get(server, "/readyz/b")[0] == 503
    status, _, body = _get(server, "/healthz/nope")
    assert status == 404
    assert b"nope" in body


def test_a_raising_check_is_a_failure_not_a_500(server: HealthServer) -> None:
    def boom() -> tuple[bool, str]:
        raise OSError("socket gone")

    server.add_check("sockets", boom)
    status, _, body = _get(server, "/healthz")
    assert status == 503
    assert b"[-]sockets failed: check raised OSError: socket gone" in body


def test_head_and_unknown_paths(server: HealthServer) -> None:
    status, headers, body = _get(server, "/healthz", method="HEAD")
    assert status == 200
    assert body == b""
    assert int(headers["Content-Length"]) > 0
    assert _get(server, "/")[0] == 404
    assert _get(server, "/metricsx")[0] == 404
    assert _get(server, "/healthz?verbose=1")[0] == 200  # query strings are ignored
    assert _get(server, "/healthz", method="POST")[0] == 501


def test_a_slow_check_does_not_block_metrics(server: HealthServer) -> None:
    release = threading.Event()

    def slow() -> tuple[bool, str]:
        release.wait(10)
        return True, ""

    server.add_check("slow", slow)
    probe = threading.Thread(target=_get, args=(server, "/healthz"))
    probe.start()
    try:
        assert _get(server, "/metrics")[0] == 200
    finally:
        release.set()
        probe.join()


def test_port_in_use_is_an_error_with_the_address() -> None:
    with HealthServer("127.0.0.1:0", CollectorRegistry()) as first:
        taken = f"127.0.0.1:{first.port}"
        with pytest.raises(HealthServerError) as err:
            HealthServer(taken, CollectorRegistry()).start()
        assert err.value.address == taken
        assert "in use" in err.value.reason


def test_reuse_port_lets_a_second_instance_bind_during_a_rolling_update() -> None:
    with HealthServer("127.0.0.1:0", CollectorRegistry(), reuse_port=True) as old:
        address = f"127.0.0.1:{old.port}"
        with HealthServer(address, CollectorRegistry(), reuse_port=True) as new:
            assert new.port == old.port
            assert _get(new, "/healthz")[0] == 200


def test_stop_closes_the_port_and_is_idempotent() -> None:
    srv = HealthServer("127.0.0.1:0", CollectorRegistry())
    with pytest.raises(RuntimeError):
        _ = srv.port
    srv.start()
    port = srv.port
    srv.stop()
    srv.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_ipv6_loopback() -> None:
    try:
        srv = HealthServer("[::1]:0", CollectorRegistry())
        srv.start()
    except HealthServerError as err:  # hosts without IPv6 say so: skip is not allowed, so check
        assert "address" in err.reason.lower() or "protocol" in err.reason.lower()
        return
    try:
        assert srv.url == f"http://[::1]:{srv.port}"
        conn = http.client.HTTPConnection("::1", srv.port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (":9464", ("", 9464)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:80", ("::1", 80)),
        ("[::]:9464", ("::", 9464)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "fragment"),
    [
        ("9464", "host:port"),
        ("127.0.0.1:http", "not a number"),
        ("127.0.0.1:70000", "out of range"),
        ("::1:80", "IPv6"),
        ("[1.2.3.4]:80", "not an IPv6"),
        ("127.0.0.1:", "not a number"),
    ],
)
def test_bad_addresses_are_rejected_at_construction(address: str, fragment: str) -> None:
    with pytest.raises(HealthServerError) as err:
        HealthServer(address, CollectorRegistry())
    assert fragment in str(err.value)
    assert err.value.address == address


def test_keep_alive_connection_serves_many_requests(server: HealthServer) -> None:
    # Prometheus reuses its connection: every answer must carry a correct Content-Length.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for path in ("/metrics", "/healthz", "/nope", "/readyz", "/metrics"):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert int(resp.getheader("Content-Length", "-1")) == len(body)
            assert resp.status in (200, 404)
    finally:
        conn.close()
