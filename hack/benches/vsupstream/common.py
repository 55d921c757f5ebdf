"""What every part of the comparison shares: the peer driver's helper version and name, the
windows it waits, a process's resident memory, and the goals of the ratio rows."""

from __future__ import annotations

from pathlib import Path

from hack.benches import Figure

MINOR = "1.37"  # the peer driver follows the current helper's interface
PEER = "peer.dra-agent.io"
AT_REST_S = 10.0
WIPE_TIMEOUT_S = 90.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


#: The goal of every ratio row: ours no slower, no bigger, no busier than the Go peer's...
RATIO_GOAL = 1.0
#: ...but for the start: an interpreter's start (loading the modules, unmarshalling their
#: code) is a floor no Go program pays, which 2.5x of the peer's start leaves room for;
START_GOAL = 2.5
#: and idle memory: the interpreter and the modules a start needs resident.
IDLE_RSS_GOAL = 1.2


def ratio(name: str, ours: float, theirs: float, goal: float = RATIO_GOAL, *,
          throughput: bool = False) -> Figure:
    """The ``ours / Go`` row of a comparison, with its verdict: ``<= goal``, or ``>= goal``
    for a throughput (higher is better)."""
    value = ours / theirs if theirs else (0.0 if not ours else float("inf"))
    if throughput:
        return Figure(f"{name}: ours / Go", value, "x", f">= {goal:g}x", value >= goal)
    return Figure(f"{name}: ours / Go", value, "x", f"<= {goal:g}x", value <= goal)
