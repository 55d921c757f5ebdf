"""The netdev hook's cost per container start: the installed bundle (``agent.netdev.install``)
run as the runtime runs it (its own loader, ``-I``, empty environment, the OCI state on stdin)
configuring one end of a veth pair in a namespace made for the run (both ends in it), beside
the bare interpreter started the same way (``-c pass``): the difference is what the hook's
imports and its netlink exchange cost. Needs root (``ip netns add``); elsewhere it reports nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hack.benches import Figure

REPO = Path(__file__).resolve().parents[2]
CONFIG = {"addresses": ["192.0.2.10/24"], "mtu": 9000,
          "routes": [{"destination": "198.51.100.0/24", "gateway": "192.0.2.1"}]}


def _median_ms(argv: list[str], stdin: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, input=stdin, env={}, check=True, capture_output=True, text=True)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def run(quick: bool) -> list[Figure]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("# netdev: needs root and iproute2", file=sys.stderr)
        return []
    runs = 10 if quick else 50
    name = f"dra-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="dra-agent-netdev-bench-") as tmp:
        subprocess.run([sys.executable, "-m", "agent.netdev.install", tmp], check=True,
                       cwd=REPO, capture_output=True, env={"PYTHONPATH": str(REPO)})
        launch = json.loads((Path(tmp) / "hook.json").read_text())
        subprocess.run(["ip", "netns", "add", name], check=True)
        sleeper = None
        try:
            subprocess.run(["ip", "-n", name, "link", "add", "net1", "type", "veth", "peer",
                            "name", "net2"], check=True)
            sleeper = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
            target = os.stat(f"/run/netns/{name}").st_ino
            while os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino != target:
                time.sleep(0.01)
            state = json.dumps({"ociVersion": "1.2.0", "id": "bench", "status": "creating",
                                "pid": sleeper.pid, "bundle": ""})
            base = [launch["path"], *launch["args"][1:]]
            hook = _median_ms([*base, "--interface=net1", f"--config={json.dumps(CONFIG)}",
                               "--claim=bench"], state, runs)
            bare = _median_ms([*base[:-2], "-c", "pass"], "", runs)
        finally:
            if sleeper is not None:
                sleeper.kill()
                sleeper.wait()
            subprocess.run(["ip", "netns", "del", name], check=False)
    return [
        Figure("netdev hook per container (addresses, MTU, route), median", hook, "ms",
               "<= 150 ms", hook <= 150),
        Figure("netdev hook's interpreter alone (-I -c pass), median", bare, "ms"),
        Figure("netdev hook's own cost (imports, netlink), median", hook - bare, "ms",
               "<= 100 ms", hook - bare <= 100),
    ]


if __name__ == "__main__":
    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
