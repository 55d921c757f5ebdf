"""What every part of the comparison shares: the peer driver's helper version and name, the
windows it waits, and a process's resident memory."""

from __future__ import annotations

from pathlib import Path

MINOR = "1.37"  # the peer driver follows the current helper's interface
PEER = "peer.dra-agent.io"
AT_REST_S = 10.0
WIPE_TIMEOUT_S = 90.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")
