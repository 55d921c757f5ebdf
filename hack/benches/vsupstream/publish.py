"""Publishing N devices for a node: the upstream resourceslice controller (``peer-slices``)
beside the agent's agent/slices (``hack.benches.publisher``), each a fresh process under its
own node's credentials on an API server that writes an audit log: the time until a watch
shows every slice, and the requests that node's identity sent (counted in the audit log)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hack.benches import Figure
from hack.benches.vsupstream.common import MINOR, PEER, ratio

PUBLISH_SIZES = (8, 128, 2048)
#: After the slices are visible, how long a publisher's trailing requests are still counted.
PUBLISH_SETTLE_S = 0.3


class _Publisher:
    """One publisher process (``peer-slices`` or ``hack.benches.publisher``) for one node."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.name = Path(argv[0]).name
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True,
                                     cwd=Path(__file__).resolve().parents[3])
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


def publish_figures(rounds: int) -> list[Figure]:
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

        figures += [
            Figure(f"vs-upstream publish {n} devices: ours", a * 1e3, "ms"),
            Figure(f"vs-upstream publish {n} devices: Go controller", b * 1e3, "ms"),
            ratio(f"vs-upstream publish {n} devices", a, b),
            Figure(f"vs-upstream publish {n} requests: ours ({verbs('ours')})", ra,
                   "requests"),
            Figure(f"vs-upstream publish {n} requests: Go ({verbs('theirs')})", rb,
                   "requests"),
            ratio(f"vs-upstream publish {n} requests", ra, rb),
        ]
    return figures
