"""Where the agent's CPU per prepare+unprepare goes, thread by thread.

The agent as ``vs-upstream`` runs it (``--no-device-metadata --no-health``, a real
kube-apiserver, the node's credentials), called by the kubelet stand-in one claim at a time
(half NICs, half GPUs). Per thread of the agent (``/proc/<pid>/task/*/schedstat``, in ns):
the CPU in a window at rest, and the CPU of ``--pairs`` prepare+unprepare pairs, less what
the same thread spends at rest in as long. Optionally the Go peer beside it (``--peer``).

``--attach 'CMD {pid}'`` runs CMD (strace, py-spy) around the pairs; ``--repo DIR`` runs the
agent of another checkout (A/B); ``--env K=V`` sets the agent's environment.

    python -m hack.benches.prepcpu --pairs 200 [--peer] [--attach 'strace -c -f -p {pid}']
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.benches.vsupstream.common import MINOR, PEER


def threads(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (comm, ns of CPU so far)."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            out[int(task.name)] = (comm, int((task / "schedstat").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def delta(before: dict[int, tuple[str, int]],
          after: dict[int, tuple[str, int]]) -> dict[int, tuple[str, int]]:
    return {tid: (comm, ns - before.get(tid, (comm, 0))[1]) for tid, (comm, ns) in after.items()}


def table(title: str, rest: dict[int, tuple[str, int]], rest_s: float,
          busy: dict[int, tuple[str, int]], busy_s: float, pairs: int,
          names: dict[int, str]) -> None:
    print(f"\n== {title}: {pairs} pairs in {busy_s:.2f} s; at rest {rest_s:.1f} s")
    print(f"{'tid':>8} {'thread':<28} {'rest us/s':>10} {'busy us/pair':>13} "
          f"{'minus rest':>11}")
    total = total_net = 0.0
    for tid in sorted(busy, key=lambda t: -busy[t][1]):
        comm, ns = busy[tid]
        at_rest = rest.get(tid, (comm, 0))[1] / rest_s  # ns per second
        per = ns / pairs / 1e3
        net = (ns - at_rest * busy_s) / pairs / 1e3
        total += per
        total_net += net
        if ns or at_rest:
            print(f"{tid:>8} {(names.get(tid) or comm)[:28]:<28} {at_rest / 1e3:>10.1f} "
                  f"{per:>13.1f} {net:>11.1f}")
    rest_total = sum(ns for _, ns in rest.values()) / rest_s
    print(f"{'':>8} {'total':<28} {rest_total / 1e3:>10.1f} {total:>13.1f} {total_net:>11.1f}")


def python_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from py-spy's dump (when py-spy is there)."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return {}
    out = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                         text=True, timeout=30, check=False).stdout
    names: dict[int, str] = {}
    for line in out.splitlines():
        # Thread 12345 (idle): "MainThread"
        if line.startswith("Thread ") and '"' in line:
            head, _, name = line.partition(": ")
            try:
                names[int(head.split()[1], 0)] = name.strip('"')
            except ValueError:
                continue
    return names


@dataclass
class Variant:
    """One agent under test: its name, environment and checkout."""

    name: str
    env: dict[str, str]
    repo: str = ""


def parse_variant(text: str) -> Variant:
    """``name[@repo][:K=V,K=V]``."""
    head, _, envs = text.partition(":")
    name, _, repo = head.partition("@")
    return Variant(name, dict(e.split("=", 1) for e in envs.split(",") if e), repo)


def group(comm: str, name: str) -> str:
    """Threads of a kind together: the handler pool's threads, the gRPC servers', ..."""
    label = name or comm
    for prefix, kind in (("dra_", "handlers (dra_*)"), ("python", "handlers (dra_*)"),
                         ("Thread-1", "grpc _serve (DRA)"), ("Thread-2", "grpc _serve (reg)"),
                         ("event_engine", "grpc event_engine"), ("reg_", "reg handlers")):
        if label.startswith(prefix):
            return kind
    return label


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=200, help="per variant, in blocks")
    ap.add_argument("--block", type=int, default=25)
    ap.add_argument("--rest", type=float, default=3.0)
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--attach", default="", help="around the first variant's first block")
    ap.add_argument("--variant", action="append", default=[],
                    help="name[@repo][:K=V,...]; default: one, 'ours'")
    ap.add_argument("--gpu-only", action="store_true")
    ap.add_argument("--threads", action="store_true", help="every thread, not the groups")
    ap.add_argument("--gets", type=int, default=0,
                    help="also: CPU of this many claim GETs through the agent's KubeHTTP")
    args = ap.parse_args()

    import tests.e2e.harness as harness
    from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS, AgentProcess, NodeDirs
    from tests.fakes.kubelet import ClaimRef, KubeletStandIn
    from tests.realk8s.agent import allocate, wait_settled
    from tests.realk8s.cluster import bin_dir, running
    from tests.realk8s.test_node_identity import pod_using
    from tests.waiting import wait_for

    variants = [parse_variant(v) for v in args.variant] or [Variant("ours", {})]
    root = Path(tempfile.mkdtemp(prefix="pc", dir="/tmp"))
    procs: list[subprocess.Popen[Any]] = []
    agents: list[Any] = []
    standins: list[Any] = []
    with running("prepcpu-") as cluster:
        try:
            cluster.apply_deploy("base")
            cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": "default"}})
            # who -> (driver, pid, stand-in, claim refs)
            drivers: dict[str, tuple[str, int, Any, list[ClaimRef]]] = {}

            def claims_and_standin(node: str, prefix: str, gpu: str, nic: str, dirs: NodeDirs,
                                   driver: str) -> tuple[Any, list[ClaimRef]]:
                """8 claims allocated on ``node`` (every other one a NIC unless --gpu-only),
                and a kubelet stand-in that has seen ``driver`` register."""
                refs = []
                for i in range(8):
                    claim = cluster.create({
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": f"{prefix}-{i}", "namespace": "default"},
                        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                            "deviceClassName": gpu if (i % 2 or args.gpu_only) else nic}}]}}})
                    allocate(cluster, claim, node, pod=pod_using(cluster, node, claim))
                    meta = claim["metadata"]
                    refs.append(ClaimRef(meta["namespace"], meta["name"], meta["uid"]))
                standin = KubeletStandIn(dirs.kubelet / "plugins_registry", retry_initial=0.05)
                standin.__enter__()
                standins.append(standin)
                standin.wait_registered(driver, timeout=30)
                return standin, refs

            own = harness.REPO
            for n, variant in enumerate(variants):
                node = f"node-cpu-{n}"
                cluster.ensure_node(node)
                kubeconfig = cluster.node_kubeconfig(node)
                (root / f"n{n}").mkdir()
                dirs = NodeDirs(root / f"n{n}")
                cdi = Path(tempfile.mkdtemp(prefix="pc-cdi-", dir="/dev/shm"))
                dirs.cdi.symlink_to(cdi)
                harness.REPO = Path(variant.repo) if variant.repo else own
                agent = AgentProcess(dirs, str(kubeconfig), "--no-health",
                                     "--no-device-metadata", node=node, env=variant.env)
                harness.REPO = own
                agents.append(agent)
                wait_settled(cluster, node, agent)
                drivers[variant.name] = (DRIVER, agent.pid, *claims_and_standin(
                    node, f"c{n}", GPU_CLASS, NIC_CLASS, dirs, DRIVER))
            if args.peer:
                node = "node-peer"
                cluster.ensure_node(node)
                kubeconfig = cluster.node_kubeconfig(node)
                (root / "peer").mkdir()
                dirs = NodeDirs(root / "peer")
                for sub in ("plugins_registry", f"plugins/{PEER}"):
                    (dirs.kubelet / sub).mkdir(parents=True)
                for kind in ("gpu", "nic"):
                    cluster.create({
                        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                        "metadata": {"name": f"{kind}.{PEER}"},
                        "spec": {"selectors": [{"cel": {"expression": (
                            f"device.driver == '{PEER}' && "
                            f"device.attributes['{PEER}'].type == '{kind}'")}}]}})
                devices = root / "devices.json"
                devices.write_text(subprocess.run(
                    [sys.executable, "-m", "agent.cli", "discover", "--simulate", "dgx-h100",
                     "-o", "json", "--node-name", node], capture_output=True, text=True,
                    check=True, timeout=60).stdout)
                cdi = Path(tempfile.mkdtemp(prefix="pc-cdi-", dir="/dev/shm"))
                peer = subprocess.Popen(
                    [str(bin_dir(MINOR) / "peer-driver"), f"--kubeconfig={kubeconfig}",
                     f"--node-name={node}", f"--driver-name={PEER}",
                     f"--kubelet-dir={dirs.kubelet}", f"--cdi-dir={cdi}",
                     f"--devices={devices}", "--kube-api-qps=50", "--kube-api-burst=100"],
                    stdout=subprocess.DEVNULL, stderr=(root / "peer.log").open("w"))
                procs.append(peer)
                wait_for(lambda: any(s["spec"]["driver"] == PEER for s in cluster.slices(node)),
                         timeout=30, what="peer slices")
                drivers["Go peer"] = (PEER, peer.pid, *claims_and_standin(
                    node, "peer", f"gpu.{PEER}", f"nic.{PEER}", dirs, PEER))

            def cycle(who: str, i: int) -> None:
                driver, _, standin, refs = drivers[who]
                ref = refs[i % len(refs)]
                got = standin.prepare(driver, [ref])[ref.uid]
                if not got.ok:
                    raise RuntimeError(f"{who} prepare: {got.error}")
                gone = standin.unprepare(driver, [ref])[ref.uid]
                if not gone.ok:
                    raise RuntimeError(f"{who} unprepare: {gone.error}")

            for who in drivers:
                for i in range(16):  # warm: connections, caches
                    cycle(who, i)
            time.sleep(1)
            names = {who: python_names(pid) for who, (_, pid, _, _) in drivers.items()}
            busy: dict[str, dict[int, tuple[str, int]]] = {w: {} for w in drivers}
            busy_s = dict.fromkeys(drivers, 0.0)
            blocks = max(1, args.pairs // args.block)
            attached = None
            for b in range(blocks):
                order = list(drivers)
                order = order[b % len(order):] + order[:b % len(order)]
                for who in order:
                    pid = drivers[who][1]
                    if args.attach and b == 0 and who == order[0]:
                        attached = subprocess.Popen(shlex.split(args.attach.format(pid=pid)))
                        time.sleep(1.0)
                    b0 = threads(pid)
                    start = time.perf_counter()
                    for i in range(args.block):
                        cycle(who, i)
                    busy_s[who] += time.perf_counter() - start
                    for tid, (comm, ns) in delta(b0, threads(pid)).items():
                        busy[who][tid] = (comm, busy[who].get(tid, (comm, 0))[1] + ns)
                    if attached is not None:
                        attached.send_signal(signal.SIGINT)
                        attached.wait(60)
                        attached = None
            pairs = blocks * args.block
            # At rest after the calls, twice, each thread's lesser window: a start-up's or a
            # resync's burst in one window is not rest.
            rest: dict[str, dict[int, tuple[str, int]]] = {}
            for who, (_, pid, _, _) in drivers.items():
                windows = []
                for _ in range(2):
                    r0 = threads(pid)
                    time.sleep(args.rest / 2)
                    windows.append(delta(r0, threads(pid)))
                rest[who] = {tid: (comm, 2 * min(ns, windows[1].get(tid, (comm, ns))[1]))
                             for tid, (comm, ns) in windows[0].items()}
            if args.threads:
                for who in drivers:
                    table(who, rest[who], args.rest, busy[who], busy_s[who], pairs, names[who])
            summary(drivers, rest, args.rest, busy, busy_s, pairs, names)
            if args.gets:
                get_cost(str(cluster.node_kubeconfig("node-cpu-0")), drivers[variants[0].name][3],
                         args.gets)
        finally:
            for s in standins:
                s.__exit__(None, None, None)
            for p in procs:
                p.terminate()
                p.wait(10)
            for a in agents:
                a.terminate()


def get_cost(kubeconfig: str, refs: list[Any], n: int) -> None:
    """This thread's CPU per claim GET through the agent's own client (``APIClaimSource``
    on ``agent.kube``'s lean client), the GET a prepare makes, and per JSON parse of it."""
    import json

    from agent.claim.model import ClaimRef
    from agent.kube.client import api_client
    from agent.plugin.apiclaims import APIClaimSource

    client = api_client(kubeconfig)
    assert client is not None
    source = APIClaimSource(client)
    own = [ClaimRef(r.namespace, r.name, r.uid) for r in refs]
    for ref in own:
        source.get(ref)
    start = time.thread_time()
    for i in range(n):
        source.get(own[i % len(own)])
    per = (time.thread_time() - start) / n
    body = json.dumps(source.get(own[0]))
    start = time.thread_time()
    for _ in range(n):
        json.loads(body)
    parse = (time.thread_time() - start) / n
    print(f"\nclaim GET through agent.kube: {per * 1e6:.0f} us of CPU each (of which the "
          f"JSON parse {parse * 1e6:.0f} us, {len(body)} bytes)")


def summary(drivers: Any, rest: Any, rest_s: float, busy: Any, busy_s: Any, pairs: int,
            names: Any) -> None:
    """µs of CPU per pair by thread group, each driver a column (less its CPU at rest)."""
    rows: dict[str, dict[str, float]] = {}
    for who in drivers:
        for tid, (comm, ns) in busy[who].items():
            at_rest = rest[who].get(tid, (comm, 0))[1] / rest_s * busy_s[who]
            key = group(comm, names[who].get(tid, "")) if who != "Go peer" else "Go threads"
            rows.setdefault(key, {}).setdefault(who, 0.0)
            rows[key][who] += (ns - at_rest) / pairs / 1e3
    cols = list(drivers)
    print(f"\n{pairs} pairs per driver, interleaved in blocks; us of CPU per pair "
          "(less the same threads at rest)")
    print(f"{'thread group':<26}" + "".join(f"{c[:14]:>15}" for c in cols))
    for key in sorted(rows, key=lambda k: -max(rows[k].values())):
        if max(abs(v) for v in rows[key].values()) < 5:
            continue
        print(f"{key[:26]:<26}" + "".join(f"{rows[key].get(c, 0.0):>15.0f}" for c in cols))
    print(f"{'total':<26}" + "".join(
        f"{sum(r.get(c, 0.0) for r in rows.values()):>15.0f}" for c in cols))
    print(f"{'wall ms per pair':<26}" + "".join(
        f"{busy_s[c] / pairs * 1e3:>15.2f}" for c in cols))
    print(f"{'at rest, us/s':<26}" + "".join(
        f"{sum(ns for _, ns in rest[c].values()) / rest_s / 1e3:>15.0f}" for c in cols))


if __name__ == "__main__":
    main()
