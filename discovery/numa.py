"""The NUMA nodes a PCI device is close to: ``resource.kubernetes.io/numaNode`` in list form.

Kubernetes 1.37 standardised numaNode as an int or (behind the DRAListTypeAttributes gate) an
int list. The list is the device's physical node first, then every NUMA node of the same
socket at the minimum ACPI SLIT distance from it, ascending (the rules of upstream's
``deviceattribute`` helper, so a claim's ``matchAttribute`` means the same for every driver):

* distances come from ``devices/system/node/node<N>/distance``; without a readable row the
  list is just the physical node;
* a node's socket is the ``physical_package_id`` of the first CPU in its ``cpulist``; a
  candidate whose socket cannot be told (a CPU-less memory node) is kept, since dropping a
  genuinely near node is worse than naming a possibly-far one;
* node IDs >= 1024 are beyond any kernel's MAX_NUMNODES: never published.

Sysfs is read lazily, once per node and scan (``NumaReader`` lives for one scan), so only the
nodes devices sit on are read and a bad file is logged once per scan, naming the file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("discovery.numa")

#: Linux's MAX_NUMNODES is 1 << CONFIG_NODES_SHIFT, and the shift is at most 10 everywhere.
MAX_NUMA_NODES = 1024


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A kernel cpulist (``0-3,8,10-11``) as sorted CPU ids; raise ValueError if garbage."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        start, end = int(first), int(last) if sep else int(first)
        if start < 0 or end < start:
            raise ValueError(f"bad range {part!r}")
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def valid_node(node: int | None, source: str) -> int | None:
    """``node`` when it can be published; an ID >= 1024 is logged (one line) and dropped."""
    if node is None or node < 0:
        return None
    if node >= MAX_NUMA_NODES:
        log.warning("ignoring NUMA node id out of range",
                    extra={"file": source, "numa_node": node, "max": MAX_NUMA_NODES - 1})
        return None
    return node


@dataclass
class NumaReader:
    """The equidistant same-socket nodes of each NUMA node under one sysfs ``root``."""

    root: Path
    _rows: dict[int, tuple[int, ...] | None] = field(default_factory=dict)
    _sockets: dict[int, int | None] = field(default_factory=dict)
    _lists: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def _node_file(self, node: int, name: str) -> str:
        return os.path.join(self.root, "devices", "system", "node", f"node{node}", name)

    def _read(self, path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                return f.read(1 << 16).decode(errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.info("cannot read sysfs file", extra={"file": path, "error": err.strerror})
            return None

    def distances(self, node: int) -> tuple[int, ...] | None:
        """The node's SLIT row, or None (logged when the file holds garbage)."""
        if node in self._rows:
            return self._rows[node]
        path = self._node_file(node, "distance")
        text = self._read(path)
        row: tuple[int, ...] | None = None
        if text:
            try:
                row = tuple(int(v) for v in text.split())
            except ValueError:
                log.warning("ignoring unparsable NUMA distance file",
                            extra={"file": path, "value": text[:40]})
            else:
                if node >= len(row):
                    log.warning("NUMA distance file has no entry for its own node",
                                extra={"file": path, "entries": len(row)})
                    row = None
        self._rows[node] = row
        return row

    def socket(self, node: int) -> int | None:
        """The physical package of the node's first CPU; None when it cannot be told."""
        if node in self._sockets:
            return self._sockets[node]
        path = self._node_file(node, "cpulist")
        text = self._read(path)
        found: int | None = None
        cpus: tuple[int, ...] = ()
        if text:
            try:
                cpus = parse_cpulist(text)
            except ValueError:
                log.warning("ignoring unparsable NUMA cpulist",
                            extra={"file": path, "value": text[:40]})
        if cpus:
            pkg = os.path.join(self.root, "devices", "system", "cpu", f"cpu{cpus[0]}",
                               "topology", "physical_package_id")
            value = self._read(pkg)
            try:
                found = int(value) if value else None
            except ValueError:
                log.warning("ignoring unparsable sysfs value",
                            extra={"file": pkg, "value": (value or "")[:40]})
        self._sockets[node] = found
        return found

    def nodes_for(self, node: int) -> tuple[int, ...]:
        """``node`` first, then the same-socket nodes at the minimum distance, ascending."""
        if node not in self._lists:
            self._lists[node] = self._compute(node)
        return self._lists[node]

    def _compute(self, node: int) -> tuple[int, ...]:
        row = self.distances(node)
        if row is None:
            return (node,)
        others = [d for i, d in enumerate(row) if i != node]
        if not others:
            return (node,)
        nearest = min(others)
        own = self.socket(node)
        near = []
        for i, d in enumerate(row):
            if i == node or d != nearest or i >= MAX_NUMA_NODES:
                continue
            if own is not None:
                theirs = self.socket(i)
                if theirs is not None and theirs != own:
                    continue
            near.append(i)
        return (node, *near)
