"""The DRA gRPC path alone: the sync server beside grpc.aio, thread counts, message handling.

What the kubelet's call costs the agent before and after the framework: HTTP/2 and the
completion queue, the hand-off to a handler thread, the request's parsing and the answer's
building and serializing. The server runs in a child process with the agent's own servicers
(``agent.plugin.server``) in front of a framework that answers at once (a 1-GPU record), so
nothing but that path is measured; the client is a grpc.aio channel in this process (the
kubelet is another process too). Per variant, 1 caller (p50 of a prepare+unprepare pair) and
16 callers at once (pairs/s), and the server's CPU time per pair (getrusage of the child:
what the machine's load changes least); medians of 5 rounds, the variants interleaved. Variants:

* ``sync-N``: ``grpc.server`` on a ``ThreadPoolExecutor`` of N threads, as the agent serves
  (N = 18: 16 workers + 2 stream slots), and N = 4, 8, 32;
* ``aio-executor``: ``grpc.aio.server``, each call's framework work in a thread pool of 16
  (``run_in_executor``: the real framework blocks on fsync and the API server);
* ``aio-inline``: the same on the event loop itself (a bound: the real framework cannot run
  there without stalling every other call).

Information rows; the verdict is docs/durability.md's "gRPC path" section.

    python -m hack.benches.grpcpath
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hack.benches import Figure, percentile

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("sync-18", "sync-4", "sync-8", "sync-32", "aio-executor", "aio-inline")
UID = "00000000-0000-0000-0000-000000000001"


class _InstantFramework:
    """``PluginFramework``'s two calls, answered at once as a prepared 1-GPU claim."""

    def __init__(self) -> None:
        from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
        from agent.plugin.framework import ClaimOutcome

        self._record = ClaimRecord(
            uid=UID, namespace="bench", name="c", state=ClaimState.PREPARE_COMPLETED,
            devices=(PreparedDevice(pool="node", device="gpu-0", requests=("req",),
                                    cdi_ids=(f"k8s.dra-agent.io/claim={UID}-gpu-0",)),))
        self._outcome = ClaimOutcome
        self.calls = 0

    def prepare(self, refs: list[Any], request_id: int = 0, gone: Any = None,
                later: Any = None) -> dict[str, Any]:
        self.calls += 1
        return {r.uid: self._outcome(record=self._record) for r in refs}

    def unprepare(self, refs: list[Any], request_id: int = 0, gone: Any = None,
                  ) -> dict[str, Any]:
        self.calls += 1
        return {r.uid: self._outcome() for r in refs}


def _serve(variant: str, socket: str) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from agent.common.metrics import Metrics
    from agent.plugin.limits import server_options
    from agent.plugin.server import DRAService
    from protos.dra.v1 import api_pb2 as pb
    from protos.dra.v1 import api_pb2_grpc as pb_grpc

    service = DRAService(_InstantFramework(), pb, "v1", Metrics())  # type: ignore[arg-type]
    if variant.startswith("sync-"):
        from concurrent import futures

        import grpc

        from agent.plugin.server import V1Servicer

        server = grpc.server(futures.ThreadPoolExecutor(int(variant[5:])),
                             options=server_options())
        pb_grpc.add_DRAPluginServicer_to_server(V1Servicer(service), server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        print(f"ready {_cpu()}", flush=True)
        sys.stdin.read()
        server.stop(0)
    else:
        asyncio.run(_serve_aio(service, pb_grpc, socket, inline=variant == "aio-inline"))
    print(f"cpu {_cpu()}", flush=True)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _serve_aio(service: Any, pb_grpc: Any, socket: str, *, inline: bool) -> None:
    from concurrent import futures

    import grpc

    from agent.plugin.limits import server_options

    pool = futures.ThreadPoolExecutor(16)
    loop = asyncio.get_running_loop()

    class Servicer(pb_grpc.DRAPluginServicer):  # type: ignore[misc]
        async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
            if inline:
                return service.prepare(request, context)
            return await loop.run_in_executor(pool, service.prepare, request, context)

        async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
            if inline:
                return service.unprepare(request, context)
            return await loop.run_in_executor(pool, service.unprepare, request, context)

    server = grpc.aio.server(options=server_options())
    pb_grpc.add_DRAPluginServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    print(f"ready {_cpu()}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await server.stop(0)


async def _drive(socket: str, pairs: int, callers: int) -> tuple[list[float], float]:
    """``pairs`` prepare+unprepare pairs per caller; each pair's seconds, and the wall time."""
    import grpc

    from protos.dra.v1 import api_pb2 as pb
    from protos.dra.v1 import api_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        claim = pb.Claim(namespace="bench", name="c", uid=UID)
        prep = pb.NodePrepareResourcesRequest(claims=[claim])
        unprep = pb.NodeUnprepareResourcesRequest(claims=[claim])
        times: list[float] = []

        async def caller() -> None:
            for _ in range(pairs):
                start = time.perf_counter()
                await stub.NodePrepareResources(prep, timeout=30)
                await stub.NodeUnprepareResources(unprep, timeout=30)
                times.append(time.perf_counter() - start)

        await caller()  # warm up: the channel connected, the server's first calls done
        times.clear()
        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return times, time.perf_counter() - start


def measure(variant: str, pairs: int) -> dict[str, float]:
    """p50 of one caller's pairs (ms), 16 callers' pairs/s, server CPU per pair (µs)."""
    with tempfile.TemporaryDirectory(prefix="gp", dir="/tmp") as tmp:
        socket = f"{tmp}/s"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
        child = subprocess.Popen([sys.executable, "-m", "hack.benches.grpcpath", "--serve",
                                  variant, socket], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert child.stdin is not None and child.stdout is not None
        try:
            ready = child.stdout.readline().split()
            if ready[:1] != ["ready"]:
                raise RuntimeError(f"{variant}: the server did not start")
            one, _ = asyncio.run(_drive(socket, pairs, 1))
            many, wall = asyncio.run(_drive(socket, pairs // 4, 16))
            child.stdin.close()
            line = child.stdout.readline().split()
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        cpu = float(line[1]) - float(ready[1])
        total = len(one) + len(many) + 2  # and one warm-up pair per drive
        return {"p50": percentile(one, 0.5) * 1e3, "rate": len(many) / wall,
                "cpu": cpu / total * 1e6}


def run(quick: bool) -> list[Figure]:
    pairs, rounds = (100, 1) if quick else (400, 5)
    got: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):  # interleaved, each round in another order: the same load
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            got[variant].append(measure(variant, pairs))
    figures: list[Figure] = []
    for variant in VARIANTS:
        med = {k: percentile([g[k] for g in got[variant]], 0.5) for k in ("p50", "rate", "cpu")}
        figures += [
            Figure(f"grpc {variant} prepare+unprepare, 1 caller, p50", med["p50"], "ms"),
            Figure(f"grpc {variant} prepare+unprepare, 16 callers", med["rate"], "pairs/s"),
            Figure(f"grpc {variant} server CPU per pair", med["cpu"], "us"),
        ]
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2], sys.argv[3])
    else:
        for figure in run(quick="--quick" in sys.argv):
            print(figure.row())
