"""explain benchmark: a 4-request claim with constraints over 2,048 devices.

The node has 128 PCIe roots, each with 8 GPUs and 8 NICs (16 slices of 128 devices); the
first quarter of the roots' GPUs are held by other claims, so the search has to walk past them.
The claim asks for 2 GPUs with at least 40Gi and a NIC under one PCIe root (matchAttribute),
plus one more GPU and NIC on one NUMA node, not the first NIC's (distinctAttribute).
Goal: <= 100 ms per call (explain() on the objects, in-process, warm). The scheduler's own
allocator (``hack/realk8s/bin/<minor>/allocate``, when built) is timed on the same input beside
it: one warm process, one JSON line per call, so its figure is the line's decode + allocate +
the answer's encode; the ratio row sets it beside explain timed the same way, from the JSON
text of the same objects (``json.loads`` + explain()), in-process and warm, rounds interleaved.
CEL costs are reported separately: compile per expression, evaluation per (device, selector),
and converting a device into CEL values.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from typing import Any

from hack.benches import Figure

DRIVER = "dra-agent.io"
NODE = "bench-node"
ROOTS = 128
PER_ROOT = 8
PCIE = "resource.kubernetes.io/pcieRoot"


def _device(name: str, kind: str, root: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": {"string": kind},
        PCIE: {"string": f"pci0000:{root:02x}"},
        "resource.kubernetes.io/numaNode": {"int": root * 2 // ROOTS},
        "productName": {"string": "NVIDIA H100 80GB HBM3" if kind == "gpu" else "ConnectX-7"},
        "driverVersion": {"version": "550.54.15"},
    }
    out: dict[str, Any] = {"name": name, "attributes": attrs}
    if kind == "gpu":
        out["capacity"] = {"memory": {"value": "80Gi"}}
    return out


def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]],
                        list[dict[str, Any]]]:
    devices = []
    for root in range(ROOTS):
        devices += [_device(f"gpu-{root}-{i}", "gpu", root) for i in range(PER_ROOT)]
        devices += [_device(f"nic-{root}-{i}", "nic", root) for i in range(PER_ROOT)]
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": f"{NODE}-{i:02d}"},
               "spec": {"driver": DRIVER, "nodeName": NODE,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 16},
                        "devices": devices[i * 128:(i + 1) * 128]}} for i in range(16)]
    classes = [{"kind": "DeviceClass", "metadata": {"name": f"{k}.{DRIVER}"}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && '
                                             f'device.attributes["{DRIVER}"].type == "{k}"'}}]}}
               for k in ("gpu", "nic")]

    def req(name: str, kind: str, count: int, *sel: str) -> dict[str, Any]:
        ex: dict[str, Any] = {"deviceClassName": f"{kind}.{DRIVER}", "count": count}
        if sel:
            ex["selectors"] = [{"cel": {"expression": s}} for s in sel]
        return {"name": name, "exactly": ex}

    claim = {"kind": "ResourceClaim", "metadata": {"name": "bench", "namespace": "default"},
             "spec": {"devices": {
                 "requests": [
                     req("gpu", "gpu", 2,
                         f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
                         f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan('
                         f'semver("535.0.0"))'),
                     req("nic", "nic", 1,
                         f'device.attributes["{DRIVER}"].productName.startsWith("ConnectX")'),
                     req("aux", "gpu", 1),
                     req("aux-nic", "nic", 1)],
                 "constraints": [
                     {"matchAttribute": PCIE, "requests": ["gpu", "nic"]},
                     {"matchAttribute": "resource.kubernetes.io/numaNode",
                      "requests": ["aux", "aux-nic"]},
                     {"distinctAttribute": "resource.kubernetes.io/numaNode",
                      "requests": ["nic", "aux"]}]}}}
    held = [{"kind": "ResourceClaim", "metadata": {"name": f"held-{root}", "namespace": "ml"},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "r", "driver": DRIVER, "pool": NODE, "device": f"gpu-{root}-{i}"}
                 for i in range(PER_ROOT)]}}}} for root in range(ROOTS // 4)]
    return claim, classes, slices, held


def run(quick: bool) -> list[Figure]:
    from agent.explain.cel_env import CelEnv
    from agent.explain.model import Selector

    claim, classes, slices, held = scenario()
    rounds = 3 if quick else 9
    times, cpu, parse, last = [], [], [], None
    go = _GoAllocator.start(claim, classes, slices, held)
    ours_line = json.dumps({"claim": claim, "classes": classes, "slices": slices,
                            "allocated": held}).encode()
    go_times, decoded_times = [], []
    try:
        # Rounds alternate between the two sides, so that the machine's load at one moment
        # weighs on both; round 0 warms both up (imports, the Go process's first call) and is
        # not counted.
        for i in range(rounds + 1):
            if go is not None and i % 2 == 0:
                go_times.append(go.call())
            start = time.perf_counter()
            last = _explain_line(ours_line)
            decoded_times.append((time.perf_counter() - start) * 1e3)
            start, start_cpu = time.perf_counter(), time.process_time()
            last = _explain(claim, classes, slices, held)
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)
            parse.append(last.stats["parseMs"])
            if go is not None and i % 2 == 1:
                go_times.append(go.call())
    finally:
        if go is not None:
            go.close()
    times, cpu, parse, decoded_times = times[1:], cpu[1:], parse[1:], decoded_times[1:]
    assert last is not None and last.fits, "the benchmark claim must fit"
    stats = last.stats
    env = CelEnv()
    exprs = [s["cel"]["expression"] for r in claim["spec"]["devices"]["requests"]
             for s in r["exactly"].get("selectors", [])]
    start = time.perf_counter()
    for i, e in enumerate(exprs):
        env.compile(Selector(e + " " * i, "bench", i, ""))  # distinct text: no cache hits
    compile_ms = (time.perf_counter() - start) * 1e3 / len(exprs)
    median, median_cpu = statistics.median(times), statistics.median(cpu)
    decoded = statistics.median(decoded_times)
    compared: list[Figure] = []
    if go is not None:
        from hack.benches.vsupstream.common import ratio

        go_ms = statistics.median(go_times[1:])
        compared = [
            Figure("explain from the JSON text, wall median", decoded, "ms"),
            Figure(f"Go allocator ({go.minor}) on the same input, wall median", go_ms, "ms"),
            ratio("explain wall median vs the Go allocator", decoded, go_ms)]
    # The goal is checked on CPU time: on the shared 2-core machine other processes' load
    # otherwise decides the verdict. Wall time is printed beside it.
    return [
        Figure("explain 4 requests, 2048 devices, CPU median", median_cpu, "ms", "<= 100 ms",
               median_cpu <= 100),
        Figure("explain 4 requests, 2048 devices, wall median", median, "ms"),
        Figure("explain 4 requests, 2048 devices, wall max", max(times), "ms"),
        Figure("explain search steps", stats["searchSteps"], "steps"),
        Figure("CEL compile per expression (with checks)", compile_ms, "ms"),
        Figure("CEL evaluations per explain", stats["celEvaluations"], "evals"),
        Figure("CEL device conversions per explain (one per distinct view)",
               stats["celConversions"], "devices"),
        Figure("explain input parsing, median", statistics.median(parse), "ms"),
        *compared,
        *_distinct_devices(claim, slices),
    ]


def _explain(claim: dict[str, Any], classes: list[dict[str, Any]],
             slices: list[dict[str, Any]], held: list[dict[str, Any]]) -> Any:
    from agent.explain import explain

    return explain(claim, classes, slices, NODE, held)


def _explain_line(line: bytes) -> Any:
    """explain as the Go allocator is timed: from the JSON text of its whole input."""
    doc = json.loads(line)
    return _explain(doc["claim"], doc["classes"], doc["slices"], doc["allocated"])


class _GoAllocator:
    """The scheduler's own allocator (``hack/realk8s/bin/<minor>/allocate --lines``), one
    warm process answering one JSON line per call: a call's time is the line's write, its
    decode, NewAllocator (CEL compiles included, a new cache per call), Allocate, the answer's
    encode and its read back here, which is what explain's time from the JSON text holds
    (decode, parse, search, verdicts); the process start is in neither. Explain also judges
    every device for every request, which the allocator never does."""

    def __init__(self, proc: subprocess.Popen[bytes], line: bytes, minor: str) -> None:
        self.proc, self.line, self.minor = proc, line, minor

    @classmethod
    def start(cls, claim: dict[str, Any], classes: list[dict[str, Any]],
              slices: list[dict[str, Any]], held: list[dict[str, Any]]) -> _GoAllocator | None:
        from tests.realk8s.cluster import bin_dir, minor_under_test

        minor = minor_under_test()
        binary = bin_dir(minor) / "allocate"
        if not binary.is_file():
            print(f"# explain: Go allocator not timed, hack/realk8s/bin/{minor}/allocate is "
                  f"not built (hack/realk8s/build.sh {minor})")
            return None
        stored = json.loads(json.dumps(claim))  # as the API server stores it: defaulted, a UID
        stored["apiVersion"], stored["metadata"]["uid"] = "resource.k8s.io/v1", "bench-uid"
        for request in stored["spec"]["devices"]["requests"]:
            request["exactly"].setdefault("allocationMode", "ExactCount")
        doc = {"node": NODE, "claims": [stored],
               "deviceClasses": [{**c, "apiVersion": "resource.k8s.io/v1"} for c in classes],
               "resourceSlices": slices,
               "allocatedDevices": [
                   {"driver": r["driver"], "pool": r["pool"], "device": r["device"]}
                   for c in held for r in c["status"]["allocation"]["devices"]["results"]]}
        proc = subprocess.Popen([str(binary), "--lines"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        return cls(proc, (json.dumps(doc) + "\n").encode(), minor)

    def call(self) -> float:
        """One call's wall time, in milliseconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = time.perf_counter()
        self.proc.stdin.write(self.line)
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        took = (time.perf_counter() - start) * 1e3
        assert "allocations" in answer, f"the Go allocator does not fit it: {answer}"
        return took

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _distinct_devices(claim: dict[str, Any], slices: list[dict[str, Any]]) -> list[Figure]:
    """A bad case for CEL: the expression reads the PCIe root, so devices share a converted
    view only with those on the same root and of the same type (256 views)."""
    from agent.explain.cel_env import CelEnv
    from agent.explain.devices import parse_slice
    from agent.explain.docs import from_object
    from agent.explain.model import Selector

    devices = [d for s in slices for d in parse_slice(from_object(s)).devices]
    env = CelEnv()
    cs = env.compile(Selector(f'device.attributes["resource.kubernetes.io"].pcieRoot != "x" && '
                              f'device.attributes["{DRIVER}"].type == "gpu"', "bench", 0, ""))
    start = time.perf_counter()
    for d in devices:
        env.matches(cs, d)
    per_device = (time.perf_counter() - start) * 1e6 / len(devices)
    return [Figure("CEL convert + evaluate, 2048 devices in 256 views, per device",
                   per_device, "us"),
            Figure("CEL evaluation alone, mean", env.stats.eval_seconds * 1e6 /
                   max(env.stats.evaluations, 1), "us"),
            Figure("CEL conversion alone, mean", env.stats.convert_seconds * 1e6 /
                   max(env.stats.conversions, 1), "us")]


if __name__ == "__main__":
    for figure in run(quick=False):
        print(figure.row())
