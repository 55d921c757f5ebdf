"""Metrics and health endpoint cost: what a Prometheus scrape and a kubelet probe take; and
what ``dra-agent doctor`` takes, as a whole process (the figure the README quotes).

The registry is filled the way a simulated DGX H100 agent fills it (8 GPUs, 56 MIG slots,
8 NICs, 64 VFs by type and health; both kubelet methods with every result; histograms with
observations), so the scrape size and time are what an operator's Prometheus will see.
"""

from __future__ import annotations

import http.client
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agent.common.metrics import Metrics
from agent.httpserver import HealthServer
from hack.benches import Figure, compiled, percentile

REPO = Path(__file__).resolve().parents[2]


def _populated() -> Metrics:
    m = Metrics()
    for kind, count in (("gpu", 8), ("mig", 56), ("nic", 8), ("vf", 64)):
        m.devices.labels(type=kind, health="healthy").set(count)
        m.devices.labels(type=kind, health="unhealthy").set(0)
    for method in ("NodePrepareResources", "NodeUnprepareResources"):
        for result in ("ok", "error"):
            m.requests.labels(method=method, result=result).inc(100)
        for i in range(100):
            m.request_duration.labels(method=method).observe(0.001 * (i % 20))
    for verb in ("create", "update", "delete"):
        m.slice_writes.labels(verb=verb, result="ok").inc()
    m.discovery_duration.observe(0.05)
    m.checkpoint_write_duration.observe(0.002)
    m.last_publish.set_to_current_time()
    return m


def _timed(conn: http.client.HTTPConnection, path: str, rounds: int) -> tuple[list[float], int]:
    times: list[float] = []
    size = 0
    for _ in range(rounds):
        start = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        times.append((time.perf_counter() - start) * 1000)
        assert resp.status == 200, (path, resp.status)
        size = len(body)
    return times, size


def run(quick: bool) -> list[Figure]:
    rounds = 200 if quick else 2000
    metrics = _populated()
    checks = {name: (lambda: (True, "")) for name in ("sockets", "threads", "discovery")}
    ready = {"published": lambda: (True, "")}
    with HealthServer("127.0.0.1:0", metrics.registry, checks, ready) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        _timed(conn, "/metrics", 20)  # warm the connection and the encoder
        scrape, size = _timed(conn, "/metrics", rounds)
        probe, _ = _timed(conn, "/readyz", rounds)
        conn.close()
    # Goals: a keep-alive scrape must not wait out a delayed ACK (~40 ms with Nagle on), and a
    # probe must be negligible next to the kubelet's 1 s probe timeout.
    scrape_p50 = statistics.median(scrape)
    probe_p50 = statistics.median(probe)
    return [
        Figure("metrics scrape, dgx-h100-sized registry, p50", scrape_p50, "ms", "<= 5 ms",
               scrape_p50 <= 5),
        Figure("metrics scrape, dgx-h100-sized registry, p99", percentile(scrape, 0.99), "ms"),
        Figure("metrics scrape size", size / 1024, "KiB"),
        Figure("/readyz probe (4 checks), p50", probe_p50, "ms", "<= 2 ms", probe_p50 <= 2),
        Figure("/readyz probe (4 checks), p99", percentile(probe, 0.99), "ms"),
        doctor(3 if quick else 5),
    ]


def doctor(rounds: int) -> Figure:
    """``doctor --simulate dgx-h100``, interpreter start included; the best of ``rounds``,
    so that a process beside it on a 2-CPU machine does not decide it."""
    compiled()
    env = {**os.environ, "DRA_AGENT_KUBECONFIG": "none"}
    times = []
    for _ in range(rounds):
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "agent.cli", "doctor", "--simulate",
                              "dgx-h100"], capture_output=True, text=True, timeout=60,
                             check=False, cwd=REPO, env=env)
        times.append(time.monotonic() - started)
        assert out.returncode == 0, out.stderr
    best = min(times) * 1000
    return Figure("doctor --simulate dgx-h100, whole process, best", best, "ms", "<= 2000 ms",
                  best <= 2000)


if __name__ == "__main__":
    for figure in run(quick=False):
        print(figure.row())
