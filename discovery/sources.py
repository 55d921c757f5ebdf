"""Where discovery reads from: one container of seams, so a simulated node and a real one
differ only in the ``Sources`` value handed to ``discover``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from discovery.gpulib import GpuLibrary
from discovery.passthrough import PciDrivers
from discovery.vfs import SriovControl

__all__ = ["GpuLibrary", "ProcRoutes", "RouteSource", "Sources"]

log = logging.getLogger("discovery.sources")


class RouteSource(Protocol):
    """Which interfaces carry the node's own traffic and must never be handed to a pod."""

    def default_route_interfaces(self) -> frozenset[str]: ...

    def interface_addresses(self) -> Mapping[str, frozenset[str]]:
        """Interface name -> the IP addresses configured on it."""
        ...


@dataclass(frozen=True, slots=True)
class Sources:
    """The seams discovery reads: sysfs tree, NVML (None: no NVIDIA support), /dev, routes."""

    sysfs_root: Path
    gpu: GpuLibrary | None
    dev_root: Path
    routes: RouteSource
    #: Host-side /proc (driver versions, /proc/devices); simulated profiles write their own.
    proc_root: Path = Path("/proc")
    #: A short label for logs and warnings ("host", "simulated dgx-h100").
    label: str = "host"
    #: Where VFs are made (--vfs dynamic); None: the kernel's sysfs under ``sysfs_root``.
    sriov: SriovControl | None = None
    #: Where GPUs are bound to vfio-pci (--gpu-passthrough); None: the kernel's sysfs.
    pci_drivers: PciDrivers | None = None


def _hex_le_ipv4(text: str) -> int:
    """/proc/net/route prints IPv4 addresses as little-endian hex."""
    return int.from_bytes(bytes.fromhex(text), "little")


class ProcRoutes:
    """Routes and addresses from procfs files under ``proc_root`` (``/proc`` on a real host).

    IPv4 defaults come from ``net/route``, IPv6 ones from ``net/ipv6_route``. Addresses: IPv6
    from ``net/if_inet6``; IPv4 from the LOCAL entries of ``net/fib_trie``, attached to the
    interface whose connected route covers them (procfs has no per-interface IPv4 list).
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def _lines(self, name: str) -> list[str]:
        try:
            return (self.proc_root / "net" / name).read_text().splitlines()
        except FileNotFoundError:
            return []  # no IPv6, or no fib_trie in a minimal container: nothing to find
        except OSError as err:
            log.info("cannot read routes", extra={"file": str(self.proc_root / "net" / name),
                                                   "error": err.strerror})
            return []

    def default_route_interfaces(self) -> frozenset[str]:
        out: set[str] = set()
        for line in self._lines("route")[1:]:
            cols = line.split()
            if len(cols) >= 8 and cols[1] == "00000000" and cols[7] == "00000000":
                out.add(cols[0])
        for line in self._lines("ipv6_route"):
            cols = line.split()
            # dest, dest prefix len, ..., device last; the loopback "unreachable" default
            # entries name lo and are skipped.
            if len(cols) >= 10 and cols[0] == "0" * 32 and cols[1] == "00" and cols[-1] != "lo":
                out.add(cols[-1])
        return frozenset(out)

    def _connected_v4(self) -> list[tuple[str, ipaddress.IPv4Network]]:
        nets = []
        for line in self._lines("route")[1:]:
            cols = line.split()
            if len(cols) < 8 or cols[1] == "00000000":
                continue
            try:
                addr = ipaddress.IPv4Address(_hex_le_ipv4(cols[1]))
                mask = ipaddress.IPv4Address(_hex_le_ipv4(cols[7]))
                nets.append((cols[0], ipaddress.IPv4Network(f"{addr}/{mask}", strict=False)))
            except ValueError:
                continue
        return nets

    def interface_addresses(self) -> Mapping[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for line in self._lines("if_inet6"):
            cols = line.split()
            if len(cols) >= 6:
                try:
                    addr = ipaddress.IPv6Address(int(cols[0], 16))
                except ValueError:
                    continue
                out.setdefault(cols[5], set()).add(str(addr))
        nets = self._connected_v4()
        prev = ""
        for line in self._lines("fib_trie"):
            text = line.strip()
            if text.startswith("/32 host LOCAL") and prev:
                try:
                    addr4 = ipaddress.IPv4Address(prev)
                except ValueError:
                    continue
                for iface, net in nets:
                    if addr4 in net:
                        out.setdefault(iface, set()).add(str(addr4))
            elif text.startswith("|-- "):
                prev = text[4:]
        return {k: frozenset(v) for k, v in out.items()}
