"""Where the agent's resident memory goes at idle (docs/memory.md): the vs-upstream bench's
agent (``dra-agent run --simulate dgx-h100 --no-device-metadata --no-health`` on the node
layout, against a real kube-apiserver), started ``--starts`` times one after another; each is
left idle ``--idle`` seconds after its slices settle, then VmRSS, the smaps breakdown and the
thread count are read. Medians are printed, and one start's smaps grouping.

    python -m hack.benches.memory [--starts 3] [--idle 30] [--env K=V ...]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from discovery.simulate.profiles import scratch_parent
from hack.benches import compiled
from hack.benches.nodestart import prepare
from hack.benches.startup import node_layout_wrap


def smaps_groups(smaps: str) -> dict[str, float]:
    """Resident KiB by kind of mapping: the heap, anonymous mappings (arenas, thread stacks,
    pymalloc), shared-object text/data, other files, the stack."""
    groups: dict[str, float] = {}
    current = "anon"
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
    for line in smaps.splitlines():
        if header.match(line):
            parts = line.split(maxsplit=5)
            name = parts[5].strip() if len(parts) > 5 else ""
            if not name:
                current = "anon"
            elif name == "[heap]":
                current = "heap"
            elif name == "[stack]":
                current = "main stack"
            elif ".so" in Path(name).name:
                current = "shared objects"
            elif name.startswith("["):
                current = name
            else:
                current = "other files"
        elif line.startswith("Rss:"):
            groups[current] = groups.get(current, 0) + int(line.split()[1])
    return groups


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            out[key] = int(value.split()[0])
    return out


def main() -> None:
    from tests.e2e.harness import AgentProcess, NodeDirs
    from tests.realk8s.agent import wait_settled
    from tests.realk8s.cluster import running

    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--smaps-out", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="a folder for the agents' logs")
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--wrapper", type=Path, default=None,
                        help="a script run instead of hack/benches/nodestart.py (same argv)")
    args = parser.parse_args()
    compiled()  # as installed: no start compiles our sources (the vs-upstream bench does so)
    env = dict(kv.split("=", 1) for kv in args.env)
    node = "node-mem"
    tree = Path(tempfile.mkdtemp(prefix="mem-node-", dir=scratch_parent()))
    root = Path(tempfile.mkdtemp(prefix="mem", dir="/tmp"))
    rows: list[dict[str, float]] = []
    try:
        prepare("dgx-h100", tree)
        with running("memory-") as cluster:
            cluster.apply_deploy("base")
            cluster.ensure_node(node)
            kubeconfig = str(cluster.node_kubeconfig(node))
            wrap = node_layout_wrap(tree)
            if args.wrapper is not None:
                wrap[2] = wrap[2].replace(str(Path(__file__).resolve().with_name("nodestart.py")),
                                          str(args.wrapper))
            for i in range(args.starts):
                (root / str(i)).mkdir()
                dirs = NodeDirs(root / str(i))
                agent = AgentProcess(dirs, kubeconfig, "--no-health", "--no-device-metadata",
                                     node=node, wrap=wrap, env=env)
                try:
                    wait_settled(cluster, node, agent)
                    time.sleep(args.idle)
                    status = _status(agent.pid)
                    smaps = Path(f"/proc/{agent.pid}/smaps").read_text()
                    if args.hold is not None:  # poke at it by hand until the file exists
                        print("holding", agent.pid, flush=True)
                        while not args.hold.exists():
                            time.sleep(0.5)
                finally:
                    agent.terminate()
                    if args.logs is not None:
                        shutil.copy(agent.log, args.logs / f"agent-{i}.log")
                groups = smaps_groups(smaps)
                row = {k: v / 1024 for k, v in status.items() if k != "Threads"}
                row["threads"] = status["Threads"]
                row.update({k: v / 1024 for k, v in groups.items()})
                rows.append(row)
                print(json.dumps({k: round(v, 1) for k, v in row.items()}), flush=True)
                if args.smaps_out is not None and i == 0:
                    args.smaps_out.write_text(smaps)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    keys = sorted({k for r in rows for k in r})
    print("median:", json.dumps({k: round(statistics.median(r.get(k, 0) for r in rows), 1)
                                 for k in keys}))


if __name__ == "__main__":
    main()
