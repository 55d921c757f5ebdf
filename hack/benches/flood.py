"""The kubelet plugin under a flood (hardening issue #19): memory stays bounded and a normal
kubelet call in the middle is answered.

The agent's plugin runs in a child process (so its peak RSS is its own, not the flooding
client's), with claims from a slow source (every GET takes ``GET_S``). The parent opens 16
health streams, then sends many concurrent NodePrepareResources of 3.6 MB each (about 56,000
claim references, the issue's flood) and, while they are in flight, one normal prepare of a
1-GPU claim. Figures: the child's peak RSS against the DaemonSet's memory limit
(deploy/base/daemonset.yaml, 512 MiB), the normal prepare's latency (goal < 1 s), how the
flood calls and the extra streams were answered. A second round floods with calls inside the
limits (256 claims each, every one a slow GET): they are all served, and the normal call waits
its turn in the queue (no goal: it shows the cost of queueing a burst rather than refusing it;
a call still queued at its deadline is answered without work).
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hack.benches import Figure
from hack.benches.plugin import NODE  # the claims' pool: the node prepare_options names

DRIVER = "dra-agent.io"
GET_S = 0.05
LIMIT_MIB = 512  # deploy/base/daemonset.yaml resources.limits.memory
STREAMS = 16
#: The kubelet's deadline (defaultClientCallTimeout).
DEADLINE_S = 45.0


def _claim(ns: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]}}},
    }


class _SlowSource:
    """Every GET takes GET_S; "normal" is the one real claim, any other is not found."""

    def __init__(self, normal_uid: str) -> None:
        self.normal_uid = normal_uid

    def get(self, ref: Any) -> Mapping[str, Any]:
        from agent.claim.model import ClaimNotFoundError

        time.sleep(GET_S)
        if ref.uid == self.normal_uid:
            return _claim(ref.namespace, ref.name, ref.uid)
        raise ClaimNotFoundError(str(ref), "not found in the API server (deleted?)")


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _agent(root: str, normal_uid: str, pipe: Connection) -> None:
    """The child: the plugin with a quiet health servicer; answers "rss" with (now, peak)."""
    import logging

    logging.disable(logging.WARNING)  # thousands of refused claims and streams: one line each
    from agent.daemon.wiring import plugin_server
    from agent.health import ChangeFeed, HealthServicer
    from agent.plugin import PluginOptions
    from agent.prepare import EnvOnlyEdits
    from discovery.model import Device, DeviceType, HostInfo, Inventory
    from hack.benches.plugin import prepare_options

    class Quiet:
        changes = ChangeFeed()

        def snapshot(self) -> dict[str, Any]:
            return {}

    base = Path(root)
    (base / "boot_id").write_text("boot-1\n")
    gpu = Device(name="gpu-0", type=DeviceType.GPU, attributes={}, capacity={},
                 host=HostInfo(pci_address="0000:18:00.0"))
    server = plugin_server(
        PluginOptions(driver_name=DRIVER, kubelet_dir=base / "kubelet"), prepare_options(base),
        lambda: Inventory(devices=(gpu,)), EnvOnlyEdits(), _SlowSource(normal_uid),
        health_servicer=HealthServicer(Quiet(), NODE),
    )
    server.start()
    pipe.send(str(server.paths.dra))
    while (msg := pipe.recv()) != "stop":
        if msg == "rss":
            pipe.send((_rss_kib("VmRSS"), _rss_kib("VmHWM")))
    Quiet.changes.close()
    server.stop(0)
    pipe.send("stopped")


def _flood(endpoint: str, normal_uid: str, calls: int, claims: int) -> dict[str, Any]:
    import grpc

    from protos.dra.v1 import api_pb2 as pb
    from protos.dra.v1 import api_pb2_grpc as pb_grpc
    from protos.drahealth.v1alpha1 import api_pb2 as hpb
    from protos.drahealth.v1alpha1 import api_pb2_grpc as hpb_grpc

    channel = grpc.insecure_channel(f"unix://{endpoint}", options=[
        ("grpc.max_send_message_length", 8 << 20)])
    grpc.channel_ready_future(channel).result(timeout=10)
    streams = [hpb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        hpb.NodeWatchResourcesRequest()) for _ in range(STREAMS)]
    stream_codes: list[str] = []

    def first(s: Any) -> None:
        try:
            next(s)
            stream_codes.append("open")
        except grpc.RpcError as err:
            stream_codes.append(err.code().name)

    readers = [threading.Thread(target=first, args=(s,), daemon=True) for s in streams]
    for t in readers:
        t.start()
    for t in readers:
        t.join(10)
    request = pb.NodePrepareResourcesRequest(claims=[
        pb.Claim(namespace="default", name=f"flood-{i:07d}", uid=str(uuid.uuid4()))
        for i in range(claims)])
    # Serialised once and sent as bytes: the client's own copies are not what is measured.
    raw = request.SerializeToString()
    call = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                               request_serializer=None,
                               response_deserializer=pb.NodePrepareResourcesResponse.FromString)
    codes: dict[str, int] = {}
    lock = threading.Lock()

    def one() -> None:
        try:
            call(raw, timeout=DEADLINE_S)
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        with lock:
            codes[code] = codes.get(code, 0) + 1

    flooders = [threading.Thread(target=one, daemon=True) for _ in range(calls)]
    for t in flooders:
        t.start()
    time.sleep(0.5)  # the flood is in flight
    stub = pb_grpc.DRAPluginStub(channel)
    normal = pb.NodePrepareResourcesRequest(claims=[
        pb.Claim(namespace="default", name="normal", uid=normal_uid)])
    start = time.perf_counter()
    try:
        answer = stub.NodePrepareResources(normal, timeout=DEADLINE_S)
        entry = answer.claims[normal_uid]
        normal_result = "error: " + entry.error if entry.error else "OK"
    except grpc.RpcError as err:
        normal_result = err.code().name
    latency = time.perf_counter() - start
    for t in flooders:
        t.join(DEADLINE_S + 10)
    for s in streams:
        s.cancel()
    channel.close()
    return {"size": len(raw), "codes": codes, "streams": stream_codes,
            "normal": normal_result, "latency_s": latency}


def _round(calls: int, claims: int) -> tuple[dict[str, Any], tuple[int, int, int]]:
    root = tempfile.mkdtemp(prefix="fl", dir="/tmp")
    normal_uid = str(uuid.uuid4())
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_agent, args=(root, normal_uid, child), daemon=True)
    proc.start()
    try:
        endpoint = parent.recv()
        parent.send("rss")
        base, _ = parent.recv()
        result = _flood(endpoint, normal_uid, calls, claims)
        parent.send("rss")
        now, peak = parent.recv()
        parent.send("stop")
        parent.recv()
        return result, (base, now, peak)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool) -> list[Figure]:
    figures: list[Figure] = []
    rounds = (
        ("3.6 MB calls", 100 if quick else 400, 56_000),
        ("256-claim calls", 16 if quick else 48, 256),
    )
    for label, calls, claims in rounds:
        result, (base, now, peak) = _round(calls, claims)
        peak_mib = peak / 1024
        codes = ", ".join(f"{k} {v}" for k, v in sorted(result["codes"].items()))
        streams = ", ".join(f"{result['streams'].count(c)} {c}"
                            for c in sorted(set(result["streams"])))
        print(f"# flood {label}: {calls} calls of {result['size'] / 1e6:.2f} MB: {codes}; "
              f"{STREAMS} streams: {streams}; normal prepare: {result['normal']}; "
              f"agent RSS {base / 1024:.0f} MiB before, {now / 1024:.0f} MiB after")
        figures += [
            Figure(f"flood {calls}x {label} + {STREAMS} streams: agent peak RSS", peak_mib,
                   "MiB", f"< {LIMIT_MIB} MiB", peak_mib < LIMIT_MIB),
            # Refused calls leave the agent at once; the normal one must then be served.
            Figure(f"flood {calls}x {label}: normal prepare, {result['normal'][:18]}",
                   result["latency_s"] * 1000, "ms",
                   "< 1000 ms, OK" if claims > 256 else None,
                   result["latency_s"] < 1 and result["normal"] == "OK" if claims > 256
                   else None),
        ]
    return figures


if __name__ == "__main__":
    for fig in run(quick=False):
        print(fig.row())
