"""Sharing benchmark (issue #16): a share's prepare beside an exclusive one, and a GPU cut in
64 shares prepared and unprepared from 16 callers at once.

Both latencies go through real gRPC, the kubelet stand-in and the fake API server, measured
in turn round by round (so a noisy neighbour hits both alike); the verdict is their ratio in
this run: a share may cost at most 10% more than an exclusive 1-device claim (it adds the sum
of the other shares' consumed capacity, read inside the same checkpoint update). The
concurrent round must leave the checkpoint exact: 64 records, one share each, the 64 shares
summing to the GPU's capacity, a 65th refused, and nothing once all are unprepared.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from discovery.model import Device, DeviceType, HostInfo, Inventory
from discovery.sharing import parse_sharing, shareable
from hack.benches import Figure, percentile
from hack.benches.plugin import served

DRIVER = "dra-agent.io"
NODE = "bench-node"
SHARES = 64
CALLERS = 16


def _claim(name: str, device: str, share: int | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "req", "driver": DRIVER, "pool": NODE, "device": device}
    if share is not None:
        result["shareID"] = str(uuid.UUID(int=share + 1, version=4))
        result["consumedCapacity"] = {"shares": "1"}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _ref(claim: dict[str, Any]) -> Any:
    from tests.fakes.kubelet import ClaimRef as KubeletRef

    m = claim["metadata"]
    return KubeletRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def run(quick: bool) -> list[Figure]:
    from tests.fakes.apiserver import FakeAPIServer

    rounds = 40 if quick else 200
    root = Path(tempfile.mkdtemp(prefix="ks", dir="/tmp"))
    plain = [Device(name=f"gpu-{i}", type=DeviceType.GPU, attributes={}, capacity={},
                    host=HostInfo(pci_address=f"0000:{0x18 + i:02x}:00.0")) for i in range(2)]
    shared, why = shareable(plain[0], parse_sharing(f"gpu=shares:{SHARES}"))
    assert shared is not None, why
    devices = (shared, plain[1])
    try:
        with (FakeAPIServer() as srv,
              served(root, lambda: Inventory(devices=devices), srv.kube(),
                     CALLERS) as (_, kubelet)):
            figures = _latency(srv, kubelet, rounds)
            figures += _concurrent(srv, kubelet, root / "kubelet")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def _latency(srv: Any, kubelet: Any, rounds: int) -> list[Figure]:
    times: dict[str, list[float]] = {"exclusive": [], "share": []}
    for i in range(rounds + 5):
        for kind, claim in (("exclusive", _claim(f"e{i}", "gpu-1")),
                            ("share", _claim(f"s{i}", "gpu-0", share=i))):
            ref = _ref(srv.put_object(claim))
            start = time.perf_counter()
            answer = kubelet.prepare(DRIVER, [ref])[ref.uid]
            took = _ms(start)
            assert answer.ok, answer.error
            assert kubelet.unprepare(DRIVER, [ref])[ref.uid].ok
            if i >= 5:  # warm-up
                times[kind].append(took)
    exclusive, share = statistics.median(times["exclusive"]), statistics.median(times["share"])
    return [
        Figure("sharing prepare exclusive 1-GPU claim, p50", exclusive, "ms"),
        Figure("sharing prepare 1 share of a GPU, p50", share, "ms",
               f"<= {1.1 * exclusive:.2f} ms", share <= 1.1 * exclusive),
        Figure("sharing prepare 1 share of a GPU, p99", percentile(times["share"], 0.99), "ms"),
    ]


def _records(kubelet_dir: Path) -> dict[str, Any]:
    path = kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text())["claims"]
    return claims


def _concurrent(srv: Any, kubelet: Any, kubelet_dir: Path) -> list[Figure]:
    """64 shares of one GPU from 16 callers at once, all held, then all released at once."""
    claims = [srv.put_object(_claim(f"c{i}", "gpu-0", share=1000 + i)) for i in range(SHARES)]
    failures: list[str] = []

    def each(step: str, part: list[dict[str, Any]]) -> None:
        for claim in part:
            ref = _ref(claim)
            call = kubelet.prepare if step == "prepare" else kubelet.unprepare
            answer = call(DRIVER, [ref])[ref.uid]
            if not answer.ok:
                failures.append(f"{step} {ref.name}: {answer.error}")

    def all_at_once(step: str) -> float:
        parts = [claims[c::CALLERS] for c in range(CALLERS)]
        threads = [threading.Thread(target=each, args=(step, p)) for p in parts]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    took = all_at_once("prepare")
    held = _records(kubelet_dir)
    exact = (sorted(held) == sorted(c["metadata"]["uid"] for c in claims)
             and all(len(r["devices"]) == 1 and r["devices"][0]["consumedCapacity"]
                     == {"shares": "1"} for r in held.values()))
    extra = _ref(srv.put_object(_claim("one-too-many", "gpu-0", share=5000)))
    refused = not kubelet.prepare(DRIVER, [extra])[extra.uid].ok
    took += all_at_once("unprepare")
    exact = exact and refused and _records(kubelet_dir) == {}
    return [
        Figure(f"sharing {SHARES} shares of one GPU, {CALLERS} callers, prepare+unprepare",
               2 * SHARES / took, "calls/s"),
        Figure(f"sharing {SHARES} shares: failed calls", len(failures), "calls", "0",
               not failures),
        Figure(f"sharing {SHARES} shares: checkpoint exact, 65th refused", int(exact), "yes=1",
               "1", exact),
    ]
