"""explain benchmark: a 4-request claim with constraints over 2,048 devices.

The node has 128 PCIe roots, each with 8 GPUs and 8 NICs (16 slices of 128 devices); the
first quarter of the roots' GPUs are held by other claims, so the search has to walk past them.
The claim asks for 2 GPUs with at least 40Gi and a NIC under one PCIe root (matchAttribute),
plus one more GPU and NIC on one NUMA node, not the first NIC's (distinctAttribute).
Goal: <= 100 ms per call. The scheduler's own allocator (``hack/realk8s/bin/<minor>/allocate``,
when built) is timed on the same input beside it: one process, one JSON line per call, so the
figure is its decode + allocate + encode, as explain's includes its parsing.
CEL costs are reported separately: compile per expression, evaluation per (device, selector),
and converting a device into CEL values.
"""

from __future__ import annotations

import statistics
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
    from agent.explain import explain
    from agent.explain.cel_env import CelEnv
    from agent.explain.model import Selector

    claim, classes, slices, held = scenario()
    rounds = 3 if quick else 9
    times, cpu, parse, last = [], [], [], None
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        last = explain(claim, classes, slices, NODE, held)
        times.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
        parse.append(last.stats["parseMs"])
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
        *_go_allocator(claim, classes, slices, held, rounds, median),
        *_distinct_devices(claim, slices),
    ]


def _go_allocator(claim: dict[str, Any], classes: list[dict[str, Any]],
                  slices: list[dict[str, Any]], held: list[dict[str, Any]], rounds: int,
                  explain_ms: float) -> list[Figure]:
    """The Go allocator's median on the same input, and explain's time over it, with the goal
    of every comparison with upstream (<= 1.0x, ``hack.benches.vsupstream``): explain also
    judges every device for every request, which the allocator never does, so this row says
    what that and the interpreter cost beside the scheduler's own code."""
    import json
    import subprocess

    from tests.realk8s.cluster import bin_dir, minor_under_test

    minor = minor_under_test()
    binary = bin_dir(minor) / "allocate"
    if not binary.is_file():
        print(f"# explain: Go allocator not timed, hack/realk8s/bin/{minor}/allocate is not "
              f"built (hack/realk8s/build.sh {minor})")
        return []
    stored = json.loads(json.dumps(claim))  # as the API server stores it: defaulted, with a UID
    stored["apiVersion"], stored["metadata"]["uid"] = "resource.k8s.io/v1", "bench-uid"
    for request in stored["spec"]["devices"]["requests"]:
        request["exactly"].setdefault("allocationMode", "ExactCount")
    doc = {"node": NODE, "claims": [stored],
           "deviceClasses": [{**c, "apiVersion": "resource.k8s.io/v1"} for c in classes],
           "resourceSlices": slices,
           "allocatedDevices": [{"driver": r["driver"], "pool": r["pool"], "device": r["device"]}
                                for c in held
                                for r in c["status"]["allocation"]["devices"]["results"]]}
    line = (json.dumps(doc) + "\n").encode()
    times = []
    with subprocess.Popen([str(binary), "--lines"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for _ in range(rounds + 1):  # the first call warms the process up: not counted
            start = time.perf_counter()
            proc.stdin.write(line)
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline())
            times.append((time.perf_counter() - start) * 1e3)
            assert "allocations" in answer, f"the Go allocator does not fit it: {answer}"
        proc.stdin.close()
    go = statistics.median(times[1:])
    from hack.benches.vsupstream.common import ratio

    return [Figure(f"Go allocator ({minor}) on the same input, wall median", go, "ms"),
            ratio("explain wall median vs the Go allocator", explain_ms, go)]


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
