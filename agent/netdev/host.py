"""What the agent asks the host about a moved interface, and the RDMA give-back: the seam the
netdev effect (``agent.prepare.effects.netdev``) receives, so its tests pass a fake.

The give-back enters the pod's namespace only by the name the hook recorded, and only when
the namespace behind that name is still the one the hook saw (its inode), so a name reused
by a later pod is never touched. A namespace already gone needs nothing: the kernel returned
the device when it was destroyed (``agent.netdev.rdma``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.netdev import rdma, rtnl
from agent.netdev.netlink import NETLINK_RDMA, NETLINK_ROUTE, Netlink, NetlinkError
from agent.netdev.netns import run_in

#: Where a runtime keeps a pod's network namespace, or a process's own.
_NETNS_PATH = re.compile(r"(/var)?/run/netns/[A-Za-z0-9._-]{1,128}|/proc/[0-9]{1,10}/ns/net")


@dataclass(frozen=True, slots=True)
class Moved:
    """What the hook recorded before it moved an RDMA device into a pod's namespace."""

    rdma_device: str
    netns: str
    inode: int


class NetdevHost(Protocol):
    def link(self, name: str) -> rtnl.Link | None:
        """The host's interface ``name`` (None: not in the host's namespace)."""
        ...

    def rdma_mode(self) -> str | None:
        """``exclusive`` or ``shared``; None where the kernel has no RDMA netlink."""
        ...

    def give_back(self, moved: Moved) -> str:
        """Bring the RDMA device back to the agent's namespace; what was done. NetlinkError
        (an OSError) when the kernel refuses."""
        ...


def read_moved(path: Path) -> Moved | None:
    """The hook's record, checked (None: none was written); ValueError when it is not one."""
    try:
        raw = json.loads(path.read_bytes()[:4096])
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    device, netns, inode = raw.get("rdmaDevice"), raw.get("netns"), raw.get("inode")
    if not isinstance(netns, str) or not _NETNS_PATH.fullmatch(netns):
        raise ValueError(f"netns {netns!r:.80} is not a network namespace path")
    if not isinstance(device, str) or isinstance(inode, bool) or not isinstance(inode, int):
        raise ValueError("rdmaDevice or inode missing")
    return Moved(rdma_device=device, netns=netns, inode=inode)


class HostNetdev:
    """``NetdevHost`` on the machine, from the agent's own network namespace."""

    def link(self, name: str) -> rtnl.Link | None:
        try:
            with Netlink(NETLINK_ROUTE) as nl:
                return rtnl.get_link(nl, name)
        except NetlinkError as err:
            if err.errno == 19:  # ENODEV
                return None
            raise

    def rdma_mode(self) -> str | None:
        try:
            with Netlink(NETLINK_RDMA) as nl:
                return rdma.netns_mode(nl)
        except NetlinkError as err:
            if err.errno in (93, 97):  # EPROTONOSUPPORT, EAFNOSUPPORT: no ib_core
                return None
            raise

    def give_back(self, moved: Moved) -> str:
        try:
            pod = os.open(moved.netns, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return "namespace gone: the kernel returned the device when it was destroyed"
        try:
            if os.fstat(pod).st_ino != moved.inode:
                return "namespace name reused by another pod: the kernel returned the device"
            home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return run_in(pod, lambda: _move_home(moved.rdma_device, home))
            finally:
                os.close(home)
        finally:
            os.close(pod)


def _move_home(device: str, home_fd: int) -> str:
    with Netlink(NETLINK_RDMA) as nl:
        if device not in rdma.devices(nl):
            return "not in the pod's namespace"
        rdma.move_device(nl, device, home_fd)
    return "moved back from the pod's namespace"
