"""The agent beside a Go driver on the upstream kubeletplugin helper, in one run.

What users compare the agent with is not our floor but the driver they would run instead: every
peer driver is a Go program on k8s.io/dynamic-resource-allocation's ``kubeletplugin`` helper and
``resourceslice`` controller. ``hack/realk8s/bin/1.37/peer-driver`` is one (the example driver's
way of preparing: a CDI spec per claim with the CDI library, a checkpoint through the kubelet's
checkpointmanager), publishing the same simulated dgx-h100 devices under the driver name
``peer.dra-agent.io``.

Both run on one node of a real kube-apiserver with the node's own credentials, registered with
the same kubelet: ``kubelet-dra``, the kubelet's own DRA manager (``pkg/kubelet/cm/dra``), which
prepares and unprepares pods of 1-GPU claims and of 8-GPU claims of each driver, interleaved
call by call (who goes first alternates per round), so both see the same API server, kubelet
and machine load. Each row prints ours, theirs and the ratio; the verdicts are the ratios.

The agent runs with --no-device-metadata and --no-health: the peer does neither (as
dra-example-driver), so both do the same work per call.

Then the same through the kubelet stand-in (tests/fakes/kubelet: the gRPC call alone, without
the kubelet's claim cache), and 16 callers at once on 16 one-device claims per driver
(throughput, and each process's peak resident memory while they run).

At rest, the slice writes of each in a 10 s window; then each driver's slices deleted as the
kubelet deletes them at its start, and the time until they are all back.

Also timed per driver, from the process start: the registration socket answering GetInfo,
and its slices complete in the API server; and each process's resident memory once idle.
Our bytecode is compiled first, as the image's ``pip install`` compiles it: an editable
checkout under PYTHONDONTWRITEBYTECODE=1 would compile every module at each start.

Publishing N devices (8, 128, 2,048) for a node, on a second API server that writes an audit
log: ``peer-slices`` (the upstream resourceslice controller alone) and ``python -m
hack.benches.publisher`` (the agent's agent/slices alone), each its own process under its own
node's credentials, started afresh for each publish (a driver publishes at its start), idle
with no devices until the audit log shows its slice watch, then told to publish N devices: the
time until a watch shows every slice of the pool, and the requests that node's identity sent
for it (counted in the audit log, so both sides are counted alike); then stopped, and its
slices deleted by the admin. Interleaved per size, who goes first alternating per round.

Skipped with one line when the binaries are not built (``hack/realk8s/build.sh 1.37``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from discovery.simulate.profiles import scratch_parent
from hack.benches import Figure, compiled, percentile

MINOR = "1.37"  # the peer driver follows the current helper's interface
PEER = "peer.dra-agent.io"
SMALL_PODS = 8  # one GPU each: every GPU of the profile
AT_REST_S = 10.0
WIPE_TIMEOUT_S = 90.0
PUBLISH_SIZES = (8, 128, 2048)
#: After the slices are visible, how long a publisher's trailing requests are still counted.
PUBLISH_SETTLE_S = 0.3


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _registered(socket: Path, timeout: float) -> float:
    """Seconds until ``socket`` answers the kubelet's GetInfo (from now)."""
    import grpc

    from protos.pluginregistration import api_pb2 as reg
    from protos.pluginregistration import api_pb2_grpc as reg_grpc

    start = time.perf_counter()
    deadline = start + timeout
    while time.perf_counter() < deadline:
        if socket.exists():
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                try:
                    reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=1)
                    return time.perf_counter() - start
                except grpc.RpcError:
                    pass
        time.sleep(0.002)
    raise RuntimeError(f"{socket} never answered GetInfo")


def _peer_class(kind: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": f"{kind}.{PEER}"},
            "spec": {"selectors": [{"cel": {"expression": (
                f"device.driver == '{PEER}' && device.attributes['{PEER}'].type == '{kind}'")}}]}}


class _PeakRSS:
    """The highest resident memory of a process while the block runs (sampled every 5 ms)."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.peak = pid, _rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mib(self.pid))

    def __enter__(self) -> _PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _parallel(call: Callable[[int], object], callers: int, rounds: int) -> float:
    """``call(i)`` ``rounds`` times on each of ``callers`` threads; seconds for all of it."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        for _ in range(rounds):
            call(i)

    start = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        for future in [pool.submit(one, i) for i in range(callers)]:
            future.result()
    return time.perf_counter() - start


def _measure(rounds: int) -> tuple[dict[tuple[str, str, str], list[float]], dict[str, float]]:
    """(driver, claim size, op) -> seconds per call, and the start/memory figures."""
    from tests.e2e.harness import DRIVER, GPU_CLASS, AgentProcess, NodeDirs
    from tests.realk8s.agent import allocate, revisions, wait_settled
    from tests.realk8s.cluster import bin_dir, running
    from tests.realk8s.kubelet import KubeletDRA
    from tests.realk8s.test_kubelet_dra import get_pod
    from tests.realk8s.test_node_identity import pod_using
    from tests.waiting import wait_for

    node = "node-vs"
    times: dict[tuple[str, str, str], list[float]] = {}
    facts: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix="vs", dir="/tmp"))  # short: socket paths
    devices = root / "devices.json"
    devices.write_text(subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover", "--simulate", "dgx-h100", "-o", "json",
         "--node-name", node], capture_output=True, text=True, check=True, timeout=60).stdout)
    peer_proc: subprocess.Popen[str] | None = None
    kubelet: KubeletDRA | None = None
    agent: AgentProcess | None = None
    shm: Path | None = None
    try:
        with running("vsupstream-") as cluster:
            cluster.apply_deploy("base")
            cluster.create(_peer_class("gpu"))
            cluster.create(_peer_class("nic"))
            cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": "default"}})
            cluster.ensure_node(node)
            kubeconfig = cluster.node_kubeconfig(node)
            (root / "n").mkdir()
            dirs = NodeDirs(root / "n")
            # Both drivers' CDI specs on tmpfs, as /var/run/cdi (the default of both) is on
            # every node: there a spec's fsync costs nothing, which the VM's disk would bill
            # to ours alone (the CDI library writes without one). The checkpoints stay on disk.
            shm = Path(tempfile.mkdtemp(prefix="vs-cdi-", dir=scratch_parent()))
            (shm / "ours").mkdir()
            (shm / "peer").mkdir()
            dirs.cdi.symlink_to(shm / "ours")
            registry = dirs.kubelet / "plugins_registry"

            def slices_of(driver: str) -> int:
                return sum(len(s["spec"].get("devices") or []) for s in cluster.slices(node)
                           if s["spec"]["driver"] == driver)

            expected = sum(len(s["spec"]["devices"])
                           for s in json.loads(devices.read_text())["items"])
            # Ours, then theirs: each timed from its own process start.
            started = time.perf_counter()
            # Like for like: the peer, as the example driver, writes no device metadata files
            # (the helper's EnableDeviceMetadata is off by default; ours is on).
            agent = AgentProcess(dirs, str(kubeconfig), "--no-health", "--no-device-metadata",
                                 node=node)
            facts["ours registration"] = (time.perf_counter() - started) + _registered(
                registry / f"{DRIVER}-reg.sock", 30)
            wait_for(lambda: slices_of(DRIVER) == expected, timeout=30, interval=0.01,
                     what="the agent's slices")
            facts["ours slices"] = time.perf_counter() - started
            wait_settled(cluster, node, agent)

            started = time.perf_counter()
            peer_log = (root / "peer.log").open("w")
            peer_proc = subprocess.Popen(
                [str(bin_dir(MINOR) / "peer-driver"), f"--kubeconfig={kubeconfig}",
                 f"--node-name={node}", f"--driver-name={PEER}", f"--kubelet-dir={dirs.kubelet}",
                 f"--cdi-dir={shm / 'peer'}", f"--devices={devices}",
                 # The kubelet's limits, as kubelet-dra has (the agent's client has none): at
                 # the example driver's defaults (5, 10) this would be a rate-limit figure.
                 "--kube-api-qps=50", "--kube-api-burst=100"],
                stdout=subprocess.DEVNULL, stderr=peer_log, text=True)
            facts["theirs registration"] = (time.perf_counter() - started) + _registered(
                registry / f"{PEER}-reg.sock", 30)
            wait_for(lambda: slices_of(PEER) == expected, timeout=30, interval=0.01,
                     what="the peer driver's slices")
            facts["theirs slices"] = time.perf_counter() - started
            facts["ours idle RSS"] = _rss_mib(agent.pid)
            facts["theirs idle RSS"] = _rss_mib(peer_proc.pid)
            _at_rest_and_wiped(cluster, node, expected, facts, slices_of)

            before = revisions(cluster, node)
            kubelet = KubeletDRA(MINOR, kubeconfig, node, dirs.kubelet)
            real = kubelet
            wait_for(lambda: all(real.registered(DRIVER, PEER).values()), timeout=30,
                     what="the kubelet registers both drivers")
            # The kubelet's start wipes the node's slices; both drivers publish them again.
            wait_for(lambda: set(revisions(cluster, node)).isdisjoint(before)
                     and slices_of(DRIVER) == expected and slices_of(PEER) == expected,
                     timeout=60, what="slices restored after the kubelet's wipe")

            pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for driver, cls in ((DRIVER, GPU_CLASS), (PEER, f"gpu.{PEER}")):
                short = "ours" if driver == DRIVER else "theirs"
                for size, count, n in (("1-device", 1, SMALL_PODS), ("8-device", 8, 1)):
                    made = []
                    for i in range(n):
                        claim = cluster.create({
                            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": f"{short}-{size}-{i}", "namespace": "default"},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                "deviceClassName": cls, "count": count}}]}}})
                        pod = pod_using(cluster, node, claim)
                        made.append((claim, pod))
                    pods[(short, size)] = [
                        {"claim": c, "pod": p} for c, p in made]
            calls: dict[str, Callable[[Mapping[str, Any]], str]] = {
                "prepare": real.prepare, "unprepare": real.unprepare}
            for size in ("1-device", "8-device"):
                # One size at a time: the 8-GPU claims need every GPU, the small ones too.
                ready: dict[str, list[dict[str, Any]]] = {}
                for short in ("ours", "theirs"):
                    ready[short] = []
                    for entry in pods[(short, size)]:
                        allocate(cluster, entry["claim"], node, pod=entry["pod"])
                        ready[short].append(get_pod(cluster, entry["pod"]))
                kubelet.active([p for ps in ready.values() for p in ps])
                for r in range(rounds):
                    order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
                    for i in range(len(ready["ours"])):
                        for who in order:
                            for op in ("prepare", "unprepare"):
                                start = time.perf_counter()
                                error = calls[op](ready[who][i])
                                times.setdefault((who, size, op), []).append(
                                    time.perf_counter() - start)
                                if error:
                                    raise RuntimeError(f"{who} {size} {op}: {error}")
                for short in ("ours", "theirs"):  # free the GPUs for the next size
                    for entry in pods[(short, size)]:
                        meta = entry["claim"]["metadata"]
                        cluster.admin.request(
                            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/default/"
                            f"resourceclaims/{meta['name']}").raise_for_status()
            facts["ours RSS after calls"] = _rss_mib(agent.pid)
            facts["theirs RSS after calls"] = _rss_mib(peer_proc.pid)
            _through_the_stand_in(cluster, node, registry, rounds, times, facts,
                                  {"ours": agent.pid, "theirs": peer_proc.pid})
    finally:
        if kubelet is not None:
            kubelet.stop()
        if peer_proc is not None:
            peer_proc.terminate()
            peer_proc.wait(10)
        if agent is not None:
            agent.terminate()
        shutil.rmtree(root, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    return times, facts


def _at_rest_and_wiped(cluster: Any, node: str, expected: int, facts: dict[str, float],
                       slices_of: Callable[[str], int]) -> None:
    """Slice writes while nothing changes (a window of AT_REST_S), then each driver's slices
    deleted as the kubelet does at its start (one DeleteCollection for the node and driver)
    and the time until they are all back."""
    from tests.e2e.harness import DRIVER

    def versions(driver: str) -> dict[str, str]:
        return {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                for s in cluster.slices(node) if s["spec"]["driver"] == driver}

    drivers = {"ours": DRIVER, "theirs": PEER}
    time.sleep(2)  # both settled: what follows is rest
    before = {who: versions(d) for who, d in drivers.items()}
    time.sleep(AT_REST_S)
    for who, driver in drivers.items():
        after = versions(driver)
        facts[f"{who} writes at rest"] = float(sum(
            1 for name, rv in after.items() if before[who].get(name) != rv)
            + len(before[who].keys() - after.keys()))
    for who, driver in drivers.items():
        selector = f"spec.nodeName={node},spec.driver={driver}"
        start = time.perf_counter()
        cluster.admin.request("DELETE", "/apis/resource.k8s.io/v1/resourceslices",
                              query=[("fieldSelector", selector)]).raise_for_status()
        deadline = start + WIPE_TIMEOUT_S
        while slices_of(driver) != expected:
            if time.perf_counter() > deadline:
                break  # reported as the timeout: upstream may wait for its resync
            time.sleep(0.01)
        facts[f"{who} wipe -> restored"] = time.perf_counter() - start


def _through_the_stand_in(cluster: Any, node: str, registry: Path, rounds: int,
                          times: dict[tuple[str, str, str], list[float]],
                          facts: dict[str, float], pids: Mapping[str, int]) -> None:
    """NodePrepareResources straight from the kubelet stand-in (no kubelet claim cache in
    between): one caller, then 16 at once on 16 claims of one device each (8 GPUs, 8 NICs),
    timing the calls and sampling each driver's resident memory while they run."""
    from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS
    from tests.fakes.kubelet import ClaimRef, KubeletStandIn
    from tests.realk8s.agent import allocate
    from tests.realk8s.test_node_identity import pod_using

    callers = 16
    refs: dict[str, list[ClaimRef]] = {}
    for short, (gpu, nic) in (("ours", (GPU_CLASS, NIC_CLASS)),
                              ("theirs", (f"gpu.{PEER}", f"nic.{PEER}"))):
        refs[short] = []
        for i in range(callers):
            claim = cluster.create({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"{short}-par-{i}", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                    "deviceClassName": gpu if i % 2 else nic}}]}}})
            allocate(cluster, claim, node, pod=pod_using(cluster, node, claim))
            meta = claim["metadata"]
            refs[short].append(ClaimRef(meta["namespace"], meta["name"], meta["uid"]))
    with KubeletStandIn(registry, retry_initial=0.05) as standin:
        drivers = {"ours": DRIVER, "theirs": PEER}
        for driver in drivers.values():
            standin.wait_registered(driver, timeout=30)

        def cycle(who: str, ref: ClaimRef) -> tuple[float, float]:
            start = time.perf_counter()
            prepared = standin.prepare(drivers[who], [ref])[ref.uid]
            middle = time.perf_counter()
            if not prepared.ok:
                raise RuntimeError(f"{who} prepare through the stand-in: {prepared.error}")
            gone = standin.unprepare(drivers[who], [ref])[ref.uid]
            if not gone.ok:
                raise RuntimeError(f"{who} unprepare through the stand-in: {gone.error}")
            return middle - start, time.perf_counter() - middle

        for r in range(rounds):
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            for i in range(callers // 2):
                for who in order:
                    prep, unprep = cycle(who, refs[who][i])
                    times.setdefault((who, "stand-in", "prepare"), []).append(prep)
                    times.setdefault((who, "stand-in", "unprepare"), []).append(unprep)
        for who in ("ours", "theirs", "theirs", "ours"):  # twice each, alternating
            def one(i: int, w: str = who) -> object:
                return cycle(w, refs[w][i])

            with _PeakRSS(pids[who]) as rss:
                seconds = _parallel(one, callers, rounds)
            facts[f"{who} parallel claims/s"] = max(
                facts.get(f"{who} parallel claims/s", 0.0), callers * rounds / seconds)
            facts[f"{who} RSS under 16 callers"] = max(
                facts.get(f"{who} RSS under 16 callers", 0.0), rss.peak)


class _Publisher:
    """One publisher process (``peer-slices`` or ``hack.benches.publisher``) for one node."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.name = Path(argv[0]).name
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True,
                                     cwd=Path(__file__).resolve().parents[2])
        self.answer("ready", 60)

    def answer(self, expected: str, timeout: float = 30) -> None:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().strip() if ready else ""
        if line != expected:
            self.close()
            said = Path(self._log.name).read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"{self.name}: said {line!r}, not {expected!r}; its last log "
                               f"line: {said[-1] if said else '(none)'}")

    def publish(self, devices: Path) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{devices}\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _audited(log: Path, user: str, since: float) -> list[dict[str, Any]]:
    """The requests ``user`` sent that the server received at or after ``since`` (epoch
    seconds), one audit event each (the last stage logged)."""
    from datetime import datetime

    seen: dict[str, dict[str, Any]] = {}
    with log.open() as f:
        for line in f:
            if f'"username":"{user}"' not in line:
                continue
            event = json.loads(line)
            received = datetime.fromisoformat(
                event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if received >= since:
                seen[event["auditID"]] = event
    return list(seen.values())


def _publish(rounds: int) -> dict[tuple[str, int, str], list[float]]:
    """(who, N, "s" | "requests") -> one value per round, and (who, N, "verb:<verb>") -> that
    verb's requests summed over the rounds.

    Each publish is a fresh publisher's first (the one a driver makes at its start): the
    process is started, idle until the audit log shows its slice watch, then told to publish;
    stopped after, its slices deleted by the admin before the next.
    """
    from hack.benches.slices import Observer, devices
    from tests.realk8s.cluster import bin_dir, running

    out: dict[tuple[str, int, str], list[float]] = {}
    root = Path(tempfile.mkdtemp(prefix="vp", dir="/tmp"))
    files = {n: root / f"devices-{n}.json" for n in PUBLISH_SIZES}
    for n, path in files.items():
        path.write_text(json.dumps(devices(n)))
    observers: dict[str, Observer] = {}
    try:
        with running("vspublish-", "--audit") as cluster:
            audit = cluster.dir / "audit.log"
            nodes = {"ours": "publish-ours", "theirs": "publish-go"}
            argv: dict[str, list[str]] = {}
            for who, node in nodes.items():
                cluster.ensure_node(node)
                kubeconfig = cluster.node_kubeconfig(node)
                argv[who] = ([str(bin_dir(MINOR) / "peer-slices"), f"--kubeconfig={kubeconfig}",
                              f"--node-name={node}", f"--driver-name={PEER}",
                              "--kube-api-qps=50", "--kube-api-burst=100"] if who == "theirs"
                             else [sys.executable, "-m", "hack.benches.publisher",
                                   f"--kubeconfig={kubeconfig}", f"--node-name={node}"])
                observers[who] = Observer(cluster.admin, node)

            def step(who: str, n: int) -> None:
                user = f"system:node:{nodes[who]}"
                launched = time.time()
                publisher = _Publisher(argv[who], root / f"{who}.log")
                try:
                    deadline = time.perf_counter() + 30
                    while not any(e["verb"] == "watch" and "resourceslices" in e["requestURI"]
                                  for e in _audited(audit, user, launched)):
                        if time.perf_counter() > deadline:
                            raise RuntimeError(f"{argv[who][0]} never watched its slices")
                        time.sleep(0.02)
                    time.sleep(0.2)  # idle: what follows is the publish alone
                    since = time.time()
                    started = time.perf_counter()
                    publisher.publish(files[n])
                    observers[who].wait(n, timeout=60)
                    out.setdefault((who, n, "s"), []).append(time.perf_counter() - started)
                    publisher.answer("updated")
                    time.sleep(PUBLISH_SETTLE_S)
                    events = _audited(audit, user, since)
                finally:
                    publisher.close()
                out.setdefault((who, n, "requests"), []).append(len(events))
                for event in events:
                    key = (who, n, f"verb:{event['verb']}")
                    out[key] = [out.get(key, [0.0])[0] + 1]
                cluster.admin.request(
                    "DELETE", "/apis/resource.k8s.io/v1/resourceslices",
                    query=[("fieldSelector", f"spec.nodeName={nodes[who]}")]).raise_for_status()
                observers[who].wait(0, timeout=60)

            for r in range(rounds):
                for n in PUBLISH_SIZES:
                    for who in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
                        step(who, n)
    finally:
        for observer in observers.values():
            observer.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _publish_figures(rounds: int) -> list[Figure]:
    import statistics

    results = _publish(rounds)
    figures: list[Figure] = []
    for n in PUBLISH_SIZES:
        a = statistics.median(results[("ours", n, "s")])
        b = statistics.median(results[("theirs", n, "s")])
        ra = max(results[("ours", n, "requests")])
        rb = max(results[("theirs", n, "requests")])

        def verbs(who: str, size: int = n) -> str:  # per publish, of the rounds' sum
            return ", ".join(f"{key[2].split(':')[1]} {v[0] / rounds:g}"
                             for key, v in sorted(results.items())
                             if key[:2] == (who, size) and key[2].startswith("verb:"))

        goal = n == PUBLISH_SIZES[-1]
        figures += [
            Figure(f"vs-upstream publish {n} devices: ours", a * 1e3, "ms"),
            Figure(f"vs-upstream publish {n} devices: Go controller", b * 1e3, "ms"),
            Figure(f"vs-upstream publish {n} devices: ours / Go", a / b, "x",
                   "<= 1.5x" if goal else None, a / b <= 1.5 if goal else None),
            Figure(f"vs-upstream publish {n} requests: ours ({verbs('ours')})", ra,
                   "requests", f"<= {rb:.0f}" if goal else None, ra <= rb if goal else None),
            Figure(f"vs-upstream publish {n} requests: Go ({verbs('theirs')})", rb,
                   "requests"),
        ]
    return figures


def run(quick: bool) -> list[Figure]:
    from tests.realk8s.cluster import bin_dir

    missing = [b for b in ("etcd", "kube-apiserver", "kubelet-dra", "allocate", "peer-driver",
                           "peer-slices")
               if not (bin_dir(MINOR) / b).is_file()]
    if missing:
        print(f"# vs-upstream: skipped, hack/realk8s/bin/{MINOR} lacks {', '.join(missing)}: "
              f"build it with hack/realk8s/build.sh {MINOR}")
        return []
    if os.environ.get("REALK8S_VERSION", MINOR) != MINOR:
        print(f"# vs-upstream: runs against {MINOR} only (REALK8S_VERSION is ignored)")
    os.environ["REALK8S_VERSION"] = MINOR
    compiled()  # as installed: the agent's start does not compile its sources
    times, facts = _measure(3 if quick else 12)
    figures: list[Figure] = []
    for size in ("1-device", "8-device", "stand-in"):
        for op in ("prepare", "unprepare"):
            ours, theirs = times[("ours", size, op)], times[("theirs", size, op)]
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                a, b = percentile(ours, q) * 1e3, percentile(theirs, q) * 1e3
                goal = op == "prepare" and name == "p50"
                figures += [
                    Figure(f"vs-upstream {op} {size} {name}: ours", a, "ms"),
                    Figure(f"vs-upstream {op} {size} {name}: Go helper", b, "ms"),
                    Figure(f"vs-upstream {op} {size} {name}: ours / Go", a / b, "x",
                           "<= 1.0x" if goal else None, a / b <= 1.0 if goal else None),
                ]
    for what in ("registration", "slices"):
        a, b = facts[f"ours {what}"], facts[f"theirs {what}"]
        start_goal = what == "registration"
        figures += [
            Figure(f"vs-upstream start -> {what}: ours", a, "s",
                   "<= 0.4 s" if start_goal else None, a <= 0.4 if start_goal else None),
            Figure(f"vs-upstream start -> {what}: Go helper", b, "s"),
        ]
    a, b = facts["ours wipe -> restored"], facts["theirs wipe -> restored"]
    figures += [
        Figure("vs-upstream kubelet wipe -> restored: ours", a, "s"),
        Figure("vs-upstream kubelet wipe -> restored: Go helper", b, "s",
               None if b < WIPE_TIMEOUT_S else f"timed out at {WIPE_TIMEOUT_S:.0f} s"),
        Figure("vs-upstream wipe -> restored: ours / Go", a / b, "x", "<= 0.05x", a / b <= 0.05),
    ]
    a, b = facts["ours writes at rest"], facts["theirs writes at rest"]
    figures += [
        Figure(f"vs-upstream slice writes in {AT_REST_S:.0f} s at rest: ours", a, "writes",
               "0", a == 0),
        Figure(f"vs-upstream slice writes in {AT_REST_S:.0f} s at rest: Go helper", b,
               "writes", "0", b == 0),
    ]
    a, b = facts["ours parallel claims/s"], facts["theirs parallel claims/s"]
    figures += [
        Figure("vs-upstream prepare+unprepare, 16 parallel callers: ours", a, "claims/s"),
        Figure("vs-upstream prepare+unprepare, 16 parallel callers: Go helper", b, "claims/s"),
        Figure("vs-upstream 16 parallel callers throughput: ours / Go", a / b, "x"),
    ]
    for what in ("idle RSS", "RSS after calls", "RSS under 16 callers"):
        a, b = facts[f"ours {what}"], facts[f"theirs {what}"]
        idle = what == "idle RSS"
        figures += [
            Figure(f"vs-upstream {what}: ours", a, "MiB"),
            Figure(f"vs-upstream {what}: Go helper", b, "MiB"),
            Figure(f"vs-upstream {what}: ours / Go", a / b, "x",
                   "<= 1.5x" if idle else None, a / b <= 1.5 if idle else None),
        ]
    figures.append(Figure("vs-upstream calls per row", len(times[("ours", "1-device",
                                                                   "prepare")]), "calls"))
    figures += _publish_figures(1 if quick else 3)
    return figures
