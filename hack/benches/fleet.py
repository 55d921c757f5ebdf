"""A fleet on one real API server: N agents (``dra-agent run --simulate dgx-h100``), each under
its own node's identity, then N ``peer-slices`` (the upstream resourceslice controller) in their
place, publishing the same devices. ``python -m hack.bench fleet``; not in the full run (it
takes most of an hour at its defaults) and not in CI.

FLEET_NODES (default 200) sets N, FLEET_REST_S (default 600; 60 with --quick) the window at
rest. Each fleet runs alone on the cluster (the agents, stopped and their slices deleted, then
the peers), so the API server's figures are each fleet's own; both against one kube-apiserver
1.37 with audit logging, whose events count each node's requests (user system:node:<node>).

Per fleet:
* start: all N started at once; seconds until every node's slices are in the API server, and
  the requests each node sent until then (mean and max per node);
* at rest, FLEET_REST_S: requests and watch requests per node; each process's RSS (mean) and
  CPU (mean per process, % of one core); the API server's RSS at the end and its CPU;
* API server restart: kube-apiserver killed (SIGKILL) and started again with the same flags:
  seconds from its /readyz until every node has a watch again (0 when all did before it
  passed), the requests from the stop until 10 s after it (per node), and slice writes (none
  due: nothing changed);
* 429: started again with --max-requests-inflight=2 --max-mutating-requests-inflight=1, every
  node's slices deleted by the admin at once (as a kubelet wipes them): seconds until every
  node has published its slices again, and the 429 answers (apiserver_request_total);
* kill -9: a quarter of the fleet killed at once and started again: seconds until all of them
  watch again, and the slice writes those nodes sent (none due: their slices were right).

Every figure is ours beside the peer's, with the ratio.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hack.benches import Figure
from hack.benches.audit import WRITES, Audit
from hack.benches.vsupstream.common import MINOR, PEER, ratio, rss_mib

FLOOD_INFLIGHT = ("--max-requests-inflight=2", "--max-mutating-requests-inflight=1")


def _admin(call: Callable[[], Any], timeout: float = 120) -> Any:
    """An admin request, again while the server answers 429 (the 429 phase's low limits
    turn the admin away too) or is not up yet."""
    from agent.kube.errors import KubeAPIError

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KubeAPIError as err:
            if err.status not in (0, 429) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ApiServer:
    """The cluster's kube-apiserver, stopped and started again with its own flags."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.pid = int(cluster.env["APISERVER_PID"])
        self.argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        self._proc: subprocess.Popen[bytes] | None = None  # once restarted: ours to reap

    def _gone(self) -> bool:
        """Whether the server stopped: exited, or a zombie no one reaps (up.sh's setsid)."""
        if self._proc is not None:
            return self._proc.poll() is not None
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return state in ("Z", "X")

    def restart(self, extra: Sequence[str] = ()) -> tuple[float, float, float]:
        """(seconds it was down, the epoch time it was stopped, and ready again). Clients get
        answers before /readyz passes: what they sent after the stop counts to the restart."""
        stopped, stopped_at = time.monotonic(), time.time()
        # SIGKILL, as a crash or an OOM kill: on SIGTERM kube-apiserver drains for its 60 s
        # shutdown timeout with the fleet's watches open, which only makes the run longer.
        os.kill(self.pid, signal.SIGKILL)
        while not self._gone():
            time.sleep(0.05)
        argv = [a for a in self.argv if not a.startswith("--max-")] + list(extra)
        with (self.cluster.dir / "apiserver.log").open("a") as log:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          start_new_session=True)
        self.pid = self._proc.pid
        env = self.cluster.dir / "cluster.env"  # down.sh stops this one
        env.write_text(re.sub(r"^APISERVER_PID=.*$", f"APISERVER_PID={self.pid}",
                              env.read_text(), flags=re.MULTILINE))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:  # a 429 is an answer too: with the low limits the fleet's retries fill them
                if self.cluster.admin.request("GET", "/readyz").status in (200, 429):
                    return time.monotonic() - stopped, stopped_at, time.time()
            except Exception:  # refused while it starts
                pass
            time.sleep(0.05)
        raise RuntimeError("kube-apiserver not ready 120 s after its restart")

    def requests_429(self) -> float:
        text = _admin(lambda: self.cluster.admin.request("GET", "/metrics")
                      .raise_for_status()).body.decode()
        return sum(float(m[1]) for m in re.finditer(
            r'^apiserver_request_total\{[^}]*code="429"[^}]*\} (\S+)$', text, re.MULTILINE))


class Fleet:
    """N processes of one kind (``ours`` or ``theirs``), one per node."""

    def __init__(self, who: str, cluster: Any, root: Path, n: int, devices: Path) -> None:
        self.who, self.cluster, self.root, self.devices = who, cluster, root, devices
        self.nodes = [f"fleet-{who}-{i:03d}" for i in range(n)]
        self.driver = "dra-agent.io" if who == "ours" else PEER
        self.kubeconfigs = {}
        for node in self.nodes:
            cluster.ensure_node(node)
            self.kubeconfigs[node] = cluster.node_kubeconfig(node)
        self.procs: dict[str, Any] = {}

    def start(self, nodes: Sequence[str]) -> None:
        from tests.e2e.harness import AgentProcess, NodeDirs

        for node in nodes:
            if self.who == "ours":
                (self.root / node).mkdir(exist_ok=True)
                dirs = NodeDirs(self.root / node)
                self.procs[node] = AgentProcess(dirs, str(self.kubeconfigs[node]), node=node)
            else:
                from tests.realk8s.cluster import bin_dir

                log = (self.root / f"{node}.log").open("a")
                proc = subprocess.Popen(
                    [str(bin_dir(MINOR) / "peer-slices"), f"--kubeconfig={self.kubeconfigs[node]}",
                     f"--node-name={node}", f"--driver-name={PEER}",
                     "--kube-api-qps=50", "--kube-api-burst=100"],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, text=True)
                assert proc.stdin is not None
                proc.stdin.write(f"{self.devices}\n")  # read once the controller is up
                proc.stdin.flush()
                self.procs[node] = proc

    def pid(self, node: str) -> int:
        return int(self.procs[node].pid)

    def kill(self, nodes: Sequence[str]) -> None:
        for node in nodes:
            os.kill(self.pid(node), signal.SIGKILL)
        for node in nodes:
            proc = self.procs.pop(node)
            (proc.proc if self.who == "ours" else proc).wait(30)

    def stop(self) -> None:
        for node in list(self.procs):
            proc = self.procs.pop(node)
            if self.who == "ours":
                proc.terminate()
            else:
                proc.terminate()
                proc.wait(30)

    def published(self, expected: int) -> set[str]:
        """The nodes whose slices hold all ``expected`` devices."""
        counts: dict[str, int] = {}
        for s in _admin(self.cluster.slices):
            if s["spec"]["driver"] == self.driver:
                node = s["spec"].get("nodeName", "")
                counts[node] = counts.get(node, 0) + len(s["spec"].get("devices") or [])
        return {n for n in self.nodes if counts.get(n) == expected}

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"fleet {self.who}: {what} not within {timeout:.0f} s")
            time.sleep(0.2)
        return time.monotonic() - started


def _devices(root: Path) -> tuple[Path, int]:
    """The simulated dgx-h100's devices as ``peer-slices`` reads them (a list of v1 Devices,
    counter consumption left out: its pools have no counter sets), and how many."""
    out = subprocess.run([sys.executable, "-m", "agent.cli", "discover", "--simulate", "dgx-h100",
                          "-o", "json", "--node-name", "fleet"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    devices = [{k: v for k, v in d.items() if k != "consumesCounters"}
               for s in json.loads(out)["items"] for d in s["spec"].get("devices") or []]
    path = root / "devices.json"
    path.write_text(json.dumps(devices))
    return path, len(devices)


def _measure(fleet: Fleet, server: ApiServer, audit: Audit, expected: int,
             rest_s: float) -> dict[str, float]:
    nodes = fleet.nodes
    n = len(nodes)
    out: dict[str, float] = {}
    timeout = 120 + 2 * n
    # --- start ------------------------------------------------------------------------
    since = time.time()
    fleet.start(nodes)
    out["start s"] = fleet.wait("all published", lambda: fleet.published(expected) == set(nodes),
                                timeout)
    time.sleep(5)  # trailing requests of the start still count to it
    start_requests = audit.per_node(nodes, since)
    out["start requests mean"] = statistics.mean(start_requests)
    out["start requests max"] = max(start_requests)
    print(f"# fleet {fleet.who}: requests per node at start: {audit.kinds(nodes, since)}")
    # --- at rest ----------------------------------------------------------------------
    time.sleep(5)
    since = time.time()
    cpu0 = {node: _cpu_s(fleet.pid(node)) for node in nodes}
    server_cpu0 = _cpu_s(server.pid)
    time.sleep(rest_s)
    until = time.time()
    out["rest requests mean"] = statistics.mean(audit.per_node(nodes, since, until))
    out["rest watches mean"] = statistics.mean(audit.per_node(nodes, since, until, ("watch",)))
    out["rest writes total"] = sum(audit.per_node(nodes, since, until, WRITES))
    out["rest RSS MiB"] = statistics.mean(rss_mib(fleet.pid(node)) for node in nodes)
    out["rest CPU %"] = statistics.mean(
        (_cpu_s(fleet.pid(node)) - cpu0[node]) / rest_s * 100 for node in nodes)
    out["server RSS MiB"] = rss_mib(server.pid)
    out["server CPU %"] = (_cpu_s(server.pid) - server_cpu0) / rest_s * 100
    # --- API server restart -------------------------------------------------------------
    out["restart down s"], stopped, ready = server.restart()
    fleet.wait("a watch on every node after the restart",
               lambda: audit.watching(nodes, stopped) == set(nodes), timeout)
    # From /readyz: a node may watch again before it (the server answers while it starts).
    out["restart -> all watch s"] = max(0.0, max(audit.watches(nodes, stopped).values()) - ready)
    time.sleep(max(0.0, ready + 10 - time.time()))
    out["restart burst per node"] = statistics.mean(audit.per_node(nodes, stopped, ready + 10))
    print(f"# fleet {fleet.who}: requests per node after the restart: "
          f"{audit.kinds(nodes, stopped, ready + 10)}")
    out["restart writes total"] = sum(audit.per_node(nodes, stopped, time.time(), WRITES))
    # --- 429 ------------------------------------------------------------------------------
    _, stopped, _ = server.restart(FLOOD_INFLIGHT)
    fleet.wait("a watch on every node (429 server)",
               lambda: audit.watching(nodes, stopped) == set(nodes), timeout)
    before = server.requests_429()
    started = time.monotonic()
    _admin(lambda: server.cluster.admin.request(
        "DELETE", "/apis/resource.k8s.io/v1/resourceslices",
        query=[("fieldSelector", f"spec.driver={fleet.driver}")]).raise_for_status())
    fleet.wait("all published again (429 server)",
               lambda: fleet.published(expected) == set(nodes), timeout * 2)
    out["429 wipe -> all published s"] = time.monotonic() - started
    out["429 answers"] = server.requests_429() - before
    _, stopped, _ = server.restart()
    # --- kill -9 a quarter --------------------------------------------------------------
    victims = nodes[: max(1, n // 4)]
    fleet.wait("a watch on every node (before kill -9)",
               lambda: audit.watching(nodes, stopped) == set(nodes), timeout)
    fleet.kill(victims)
    since = time.time()
    fleet.start(victims)
    out["kill -9 -> all watch s"] = fleet.wait(
        "a watch again on every killed node",
        lambda: audit.watching(victims, since) == set(victims)
        and fleet.published(expected) == set(nodes), timeout)
    time.sleep(5)
    out["kill -9 writes total"] = sum(audit.per_node(victims, since, time.time(), WRITES))
    return out


#: (key, row, unit, throughput-like: higher is better)
ROWS = (
    ("start s", "start -> every node published", "s"),
    ("start requests mean", "requests per node at start, mean", "requests"),
    ("start requests max", "requests per node at start, max", "requests"),
    ("rest requests mean", "requests per node at rest", "requests"),
    ("rest watches mean", "watch requests per node at rest", "watches"),
    ("rest writes total", "slice writes at rest, all nodes", "writes"),
    ("rest RSS MiB", "RSS per process at rest, mean", "MiB"),
    ("rest CPU %", "CPU per process at rest, mean", "% core"),
    ("server RSS MiB", "kube-apiserver RSS after the rest", "MiB"),
    ("server CPU %", "kube-apiserver CPU at rest", "% core"),
    ("restart down s", "kube-apiserver restart, down", "s"),
    ("restart -> all watch s", "restart: ready -> every node watching", "s"),
    ("restart burst per node", "restart: requests per node in 10 s", "requests"),
    ("restart writes total", "restart: slice writes, all nodes", "writes"),
    ("429 wipe -> all published s", "429 server: wipe -> every node published", "s"),
    ("429 answers", "429 server: 429 answers", "answers"),
    ("kill -9 -> all watch s", "kill -9 a quarter -> all watching", "s"),
    ("kill -9 writes total", "kill -9: writes by the restarted nodes", "writes"),
)


@contextmanager
def _cluster() -> Iterator[Any]:
    from tests.realk8s.cluster import running

    os.environ["REALK8S_VERSION"] = MINOR
    with running("fleet-", "--audit") as cluster:
        yield cluster


def run(quick: bool) -> list[Figure]:
    from tests.realk8s.cluster import bin_dir

    missing = [b for b in ("etcd", "kube-apiserver", "peer-slices")
               if not (bin_dir(MINOR) / b).is_file()]
    if missing:
        print(f"# fleet: skipped, hack/realk8s/bin/{MINOR} lacks {', '.join(missing)}: "
              f"build it with hack/realk8s/build.sh {MINOR}")
        return []
    n = int(os.environ.get("FLEET_NODES", "200"))
    rest_s = float(os.environ.get("FLEET_REST_S", "60" if quick else "600"))
    from hack.benches import compiled

    compiled()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="fl", dir="/tmp"))  # short: socket paths
    results: dict[str, dict[str, float]] = {}
    try:
        devices, expected = _devices(root)
        with _cluster() as cluster:
            cluster.apply_deploy("base")
            server = ApiServer(cluster)
            audit = Audit(cluster.dir / "audit.log")
            for who in ("ours", "theirs"):
                fleet = Fleet(who, cluster, root, n, devices)
                try:
                    results[who] = _measure(fleet, server, audit, expected, rest_s)
                finally:
                    fleet.stop()
                cluster.admin.request(  # the next fleet starts on an empty cluster
                    "DELETE", "/apis/resource.k8s.io/v1/resourceslices",
                    query=[("fieldSelector", f"spec.driver={fleet.driver}")])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = [Figure("fleet nodes per fleet", n, "nodes"),
               Figure("fleet window at rest", rest_s, "s")]
    for key, name, unit in ROWS:
        a, b = results["ours"][key], results["theirs"][key]
        figures += [Figure(f"fleet {name}: ours", a, unit),
                    Figure(f"fleet {name}: peer-slices", b, unit),
                    ratio(f"fleet {name}", a, b)]
    figures.append(Figure("fleet bench run time", time.monotonic() - started, "s"))
    return figures


if __name__ == "__main__":
    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
