"""Instructions per call of the hot paths: a regression shows here whatever the machine's load.

Timings on a shared 2-core VM spread by 2.5x from one day to the next; the instructions a call
executes in user space do not. The cases run in one child process under ``valgrind
--tool=callgrind`` with instrumentation off while it imports and sets up (at about 5x, not
50x); each warms up with two calls, then counts an empty window and a window of N calls
(``callgrind_control`` from the child itself); the figure is their difference over N, in
millions of instructions (Minstr). Same input, same count: PYTHONHASHSEED is fixed. Where
valgrind is missing, ``perf stat -e instructions:u`` counts a run of N calls and one of 0 and
takes the difference (hardware counters: often absent in a VM, as on ours). Where neither
works the area says so in one line and prints nothing else. Information rows, no goals: what
to compare is the figure of the previous run on the same commit range.

Cases:
* prepare + unprepare of a 1-GPU claim through the plugin's framework, in-process: claim
  parsing, the checkpoint's writes (one fsync per call) and the CDI spec, device metadata
  files on (the daemon's default); claims from memory (no API server, no gRPC);
* the same (device metadata off) while 64 other claims are prepared: what a checkpoint
  write costs per record it holds;
* the slices of 2,048 devices (16 slices) rendered as the controller renders them for a
  create, and planned against the same slices as stored (the steady-state compare: no write);
* explain of the 4-request claim with constraints of the explain bench on a small node
  (2 PCIe roots on 2 NUMA nodes, 32 devices, nothing held).

    python -m hack.benches.instructions
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hack.benches import Figure

#: Claims held prepared in the "held" case: a node's many small claims (MIG slices, shares,
#: VFs), each a record of the checkpoint every write holds.
HELD = 64
#: case -> (row name, calls counted). The same with --quick: the time is valgrind's start and
#: the set-up, and a count over fewer calls would not compare with the full run's.
CASES: dict[str, tuple[str, int]] = {
    "prepare": ("instructions per prepare+unprepare, 1 GPU, in-process", 20),
    "held": (f"  the same with {HELD} other claims prepared", 10),
    "slices": ("instructions per render+compare, 2048 devices", 3),
    "explain": ("instructions per explain, 4 requests, 32 devices", 10),
}
WARM_UP = 2
ROOT = Path(__file__).resolve().parents[2]


# --- the cases (run in the child) ---------------------------------------------------------


@contextmanager
def _prepare_case(device_metadata: bool = True) -> Iterator[Callable[[], None]]:
    with prepare_node(device_metadata) as calls:
        prepare, unprepare = calls[0]

        def once() -> None:
            prepare()
            unprepare()

        yield once


@contextmanager
def _held_case() -> Iterator[Callable[[], None]]:
    with prepare_node(False, claims=HELD + 1) as calls:
        for prepare, _ in calls[:HELD]:
            prepare()
        prepare, unprepare = calls[HELD]

        def once() -> None:
            prepare()
            unprepare()

        yield once


Calls = list[tuple[Callable[[], None], Callable[[], None]]]


@contextmanager
def prepare_node(device_metadata: bool = True, cdi_parent: Path | None = None,
                 claims: int = 1) -> Iterator[Calls]:
    """A plugin of 8 simulated GPUs (more when ``claims`` asks) in a temp dir, and the
    prepare and the unprepare of each of ``claims`` 1-GPU claims through its framework; the
    CDI dir under ``cdi_parent`` when given (a tmpfs, for ``hack.benches.syscalls``)."""
    from agent.claim.model import ClaimRef
    from agent.common.metrics import Metrics
    from agent.daemon.wiring import plugin_server
    from agent.plugin import PluginOptions
    from agent.prepare import EnvOnlyEdits
    from agent.prepare.options import PrepareOptions
    from discovery.model import Device, DeviceType, HostInfo, Inventory
    from hack.benches.plugin import DRIVER, NODE, _claim

    root = Path(tempfile.mkdtemp(prefix="ic", dir="/tmp"))
    cdi = Path(tempfile.mkdtemp(prefix="ic", dir=cdi_parent)) if cdi_parent else root
    try:
        boot = root / "boot_id"
        boot.write_text("bench\n")
        gpus = tuple(Device(name=f"gpu-{i}", type=DeviceType.GPU, attributes={}, capacity={},
                            host=HostInfo(pci_address=f"0000:{i:02x}:00.0"))
                     for i in range(max(8, claims)))
        objects: dict[str, Mapping[str, Any]] = {}
        refs = []
        for i in range(claims):
            claim = _claim(f"ic{i or ''}", [f"gpu-{i}"])
            claim["metadata"]["uid"] = str(uuid.UUID(int=1 + i))  # the same bytes every run
            objects[claim["metadata"]["uid"]] = claim
            refs.append(ClaimRef("bench", claim["metadata"]["name"], claim["metadata"]["uid"]))

        class Claims:
            def get(self, ref: ClaimRef) -> Mapping[str, Any]:
                return objects[ref.uid]

        options = PluginOptions(driver_name=DRIVER, kubelet_dir=root / "k")
        prepare = PrepareOptions(driver_name=DRIVER, node_name=NODE, cdi_dir=cdi / "cdi",
                                 plugin_dir=root / "k" / "plugins" / DRIVER, boot_id_path=boot,
                                 device_metadata=device_metadata)
        server = plugin_server(options, prepare, lambda: Inventory(devices=gpus), EnvOnlyEdits(),
                               Claims(), metrics=Metrics())
        server.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
        server.preparer.recover()

        def calls(ref: ClaimRef) -> tuple[Callable[[], None], Callable[[], None]]:
            def prepare_once() -> None:
                if server.framework.prepare([ref])[ref.uid].record is None:
                    raise RuntimeError("prepare failed")

            def unprepare_once() -> None:
                if server.framework.unprepare([ref])[ref.uid].error:
                    raise RuntimeError("unprepare failed")

            return prepare_once, unprepare_once

        yield [calls(ref) for ref in refs]
        server.preparer.checkpoint.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if cdi_parent:
            shutil.rmtree(cdi, ignore_errors=True)


@contextmanager
def _slices_case() -> Iterator[Callable[[], None]]:
    import json

    from agent.slices import Owner, chunk_devices, render_slices
    from agent.slices.pools import to_desired
    from agent.slices.sync import OwnerRef, plan_pool
    from discovery.model import DriverResources, Pool
    from hack.benches.slices import devices

    driver, node = "dra-agent.io", "bench-node"
    owner = Owner(kind="Node", name=node, uid="node-uid")
    resources = DriverResources({node: Pool(chunk_devices(devices(2048)))})
    stored = json.loads(json.dumps(render_slices(driver, owner, resources)))
    for i, obj in enumerate(stored):  # as the server returns them
        meta = obj["metadata"]
        meta.update(name=f"{meta.pop('generateName')}{i:05d}", uid=f"slice-{i}",
                    resourceVersion=str(100 + i))
    ref = OwnerRef("v1", "Node", node, "node-uid")

    def once() -> None:
        render_slices(driver, owner, resources)
        pool = to_desired(resources, owner)[node].pool
        plan = plan_pool(driver, node, pool, stored, ref)
        if plan.creates or plan.updates or plan.deletes:
            raise RuntimeError("the stored slices should need no write")

    yield once


@contextmanager
def _explain_case() -> Iterator[Callable[[], None]]:
    from agent.explain import explain
    from hack.benches.explain import DRIVER, NODE, PER_ROOT, _device, scenario

    claim, classes, _, _ = scenario()
    devices: list[dict[str, Any]] = []
    for root in (0, 64):  # NUMA nodes 0 and 1: the claim's distinctAttribute can be met
        devices += [_device(f"gpu-{root}-{i}", "gpu", root) for i in range(PER_ROOT)]
        devices += [_device(f"nic-{root}-{i}", "nic", root) for i in range(PER_ROOT)]
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": f"{NODE}-0"},
               "spec": {"driver": DRIVER, "nodeName": NODE, "devices": devices,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}}]

    def once() -> None:
        if not explain(claim, classes, slices, NODE, []).fits:
            raise RuntimeError("the small explain case must fit")

    yield once


_SETUPS: dict[str, Callable[[], Any]] = {
    "prepare": _prepare_case, "held": _held_case, "slices": _slices_case,
    "explain": _explain_case}


def _child(cases: list[str], calls: list[int], tool: str) -> None:
    """Set each case up and run it; under callgrind, dump an empty window then its calls
    (dumps 2k+1 and 2k+2 for the k-th case), instrumented only in between."""
    import gc
    import logging

    logging.disable(logging.CRITICAL)

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                       capture_output=True, timeout=60)

    for case, n in zip(cases, calls, strict=True):
        with _SETUPS[case]() as once:
            for _ in range(WARM_UP):
                once()
            gc.collect()  # the collector's counters the same at every start of a window
            if tool == "callgrind":
                control("--instr=on")
                control("--zero")
                control("--dump")  # the window's own cost
                for _ in range(n):
                    once()
                control("--dump")
                control("--instr=off")
            else:
                for _ in range(n):
                    once()


# --- the parent -----------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0",
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT),
                                                        os.environ.get("PYTHONPATH"))))}


def _works(argv: list[str]) -> str:
    """The tool's output on ``python -c pass``, or "" when it cannot run here."""
    try:
        done = subprocess.run([*argv, sys.executable, "-c", "pass"], check=False,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr if done.returncode == 0 else ""


def tool() -> tuple[str | None, str]:
    """("callgrind" | "perf" | None, why not the others)."""
    if shutil.which("valgrind") and shutil.which("callgrind_control") and "refs:" in _works(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             "--callgrind-out-file=/dev/null"]):
        return "callgrind", ""
    why = "valgrind's callgrind does not run"
    if shutil.which("perf"):
        out = _works(["perf", "stat", "-x,", "-e", "instructions:u"])
        if re.search(r"^\d+,", out, re.MULTILINE):
            return "perf", ""
        said = out.strip().splitlines()[-1] if out.strip() else "fails"
        return None, f"{why}, perf stat has no instruction counter here ({said})"
    return None, f"{why}, no perf"


def _callgrind(cases: dict[str, int]) -> dict[str, float]:
    """Instructions per call of each case, all in one child (one start, one set of imports)."""
    out = Path(tempfile.mkdtemp(prefix="cg", dir="/tmp"))
    try:
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out / 'cg.out'}", sys.executable, "-m",
             "hack.benches.instructions", "--child", ",".join(cases),
             ",".join(map(str, cases.values())), "callgrind"],
            check=True, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
        result = {}
        for k, (case, calls) in enumerate(cases.items()):
            empty, full = (_summary(out / f"cg.out.{2 * k + i}") for i in (1, 2))
            result[case] = (full - empty) / calls
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _summary(dump: Path) -> int:
    match = re.search(r"^summary: (\d+)$", dump.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{dump}: no summary line")
    return int(match.group(1))


def _perf(cases: dict[str, int]) -> dict[str, float]:
    """Instructions per call of each case: a child running its calls less one running none."""
    def count(case: str, n: int) -> int:
        done = subprocess.run(
            ["perf", "stat", "-x,", "-e", "instructions:u", sys.executable, "-m",
             "hack.benches.instructions", "--child", case, str(n), "perf"],
            check=True, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
        match = re.search(r"^(\d+),", done.stderr, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"perf stat: no count in {done.stderr.strip()!r}")
        return int(match.group(1))

    return {case: (count(case, n) - count(case, 0)) / n for case, n in cases.items()}


def run(quick: bool) -> list[Figure]:  # quick: the same counts either way
    which, why = tool()
    if which is None:
        print(f"# instructions: skipped, {why}")
        return []
    print(f"# instructions: counted by {which}")
    measure = _callgrind if which == "callgrind" else _perf
    counts = measure({case: calls for case, (_, calls) in CASES.items()})
    return [Figure(name, counts[case] / 1e6, "Minstr") for case, (name, _) in CASES.items()]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2].split(","), [int(n) for n in sys.argv[3].split(",")], sys.argv[4])
    else:
        for figure in run(quick=False):
            print(figure.row())
