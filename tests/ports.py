"""Loopback ports for the processes tests start, safe under pytest-xdist."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path


def _port_slice() -> range:
    """This process's own ports: a share of those below the kernel's ephemeral range (which
    no bind to port 0, nor any outgoing connection, is ever given), one share per pytest-xdist
    worker (PYTEST_XDIST_WORKER gwN of PYTEST_XDIST_WORKER_COUNT)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = 10000
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    span = (low - first) // max(workers, 1)
    if span < 100:
        return range(0)
    return range(first + worker * span, first + (worker + 1) * span)


_PORTS = _port_slice()
#: Where the next look starts: at random, so that two pytest runs on one machine do not walk
#: the same ports in step.
_next = random.randrange(len(_PORTS)) if _PORTS else 0


def free_port() -> int:
    """A free loopback TCP port for a process the test starts, which binds it itself later.

    Not the kernel's pick (bind to port 0, then close): between that close and the process's
    own bind, a test in another pytest-xdist worker could be handed the same port by its own
    bind to port 0 (a fake API server, say), and the process would fail to start. These ports
    are this worker's alone, taken in turn, each checked free first."""
    global _next
    for _ in range(len(_PORTS)):
        port = _PORTS[_next % len(_PORTS)]
        _next += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (another run, a service on the machine): the next one
            return port
    with socket.socket() as s:  # no slice: a machine whose ephemeral range starts low
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
