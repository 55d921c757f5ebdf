"""VFs on demand (``--vfs dynamic``): a PF with SR-IOV and no VFs yet offers the VFs it could
have as candidate devices consuming from its counter set (``<pf>-vfs``: ``vfs`` = TotalVFs, or
NumVFs once they exist). The PF consumes the whole set, so it and its VFs are never allocated
at once (``on_demand``).

The kernel changes ``sriov_numvfs`` only from 0 to N or from N to 0: VFs cannot be added one
at a time, and going back to 0 destroys every VF, in use or not. So the agent **pre-sizes on
first use** (``agent.prepare.effects.vfs``): the first prepare of a candidate of a PF with no
VFs writes TotalVFs, once; every VF then exists and later claims get idle ones. The agent never
writes any other value (no shrinking, no growing while VFs exist), so a VF in use is never
destroyed. A PF that already has VFs is offered as today: its VFs as they are, no candidates.

A candidate is named as its VF will be (``vf-<pci address>``, the address from the PF's
``sriov_offset``/``sriov_stride``: routing ID = PF's + offset + stride x index), so a claim's
device keeps its name once the VF exists.

**Bandwidth** (``--vf-bandwidth RATE``, with ``dynamic``): each VF of a PF is guaranteed RATE
of its link. The PF's counter set gains ``bandwidth`` = the link's negotiated speed, and each of
its VFs (candidates and VFs that exist alike, as a counter set stays one set across the
pre-sizing) consumes RATE from it, so the scheduler never hands out more VFs than the link
carries; prepare caps the VF at RATE (``max_tx_rate``, rtnetlink IFLA_VF_RATE) and unprepare
lifts the cap. Only the VFs the link can carry are offered (indexes below link / RATE): the
other VFs could never be allocated, and 64 identical VFs of which 4 fit make a claim for 5 try
every 4 of 64 in the scheduler, until its 10 s filter timeout, on every node. A PF whose link
is down, whose speed is unknown or below RATE offers none of its VFs, with a warning: a VF there
could not have its share.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from discovery.model import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceType,
    HostInfo,
)
from discovery.names import pci_name
from discovery.pcidrivers import PciDriverError, SysfsPciDrivers

COUNTER = "vfs"
BANDWIDTH = "bandwidth"
#: HostInfo.extra of a candidate: the VF's index under its PF.
EXTRA_CANDIDATE = "sriovCandidateIndex"
EXTRA_TOTAL = "sriovTotalVFs"
#: HostInfo.extra of a VF under --vf-bandwidth: the cap prepare sets, in Mbit/s.
EXTRA_RATE = "vfMaxTxRateMbps"
_RATE = re.compile(r"([1-9][0-9]{0,9})([MGT])")
_MBPS = {"M": 1, "G": 1000, "T": 1000_000}


def parse_vf_rate(text: str) -> int:
    """``--vf-bandwidth``: a bit/s quantity in whole Mbit/s ("25G", "2500M") -> Mbit/s."""
    match = _RATE.fullmatch(text.strip()) if isinstance(text, str) else None
    mbps = int(match.group(1)) * _MBPS[match.group(2)] if match else 0
    if not 0 < mbps < 1 << 32:  # IFLA_VF_RATE's max_tx_rate is a __u32 of Mbit/s
        raise ValueError(f"expected a rate such as 25G or 2500M (bit/s, whole Mbit/s), got "
                         f"{text!r:.40}")
    return mbps


def rate_quantity(mbps: int) -> str:
    """Mbit/s as the bit/s quantity slices carry ("25G", "2500M")."""
    return f"{mbps // 1000}G" if mbps % 1000 == 0 else f"{mbps}M"
_COPIED = (PCIE_ROOT, NUMA_NODE, "pcieSwitch", "vendor", "pciVendorID", "linkType", "mtu")


def counter_set_name(pf_name: str) -> str:
    return f"{pf_name}-vfs"


def vf_address(pf_bdf: str, offset: int, stride: int, index: int) -> str:
    """The PCI address of VF ``index`` of the PF at ``pf_bdf`` (SR-IOV routing IDs)."""
    domain, bus, rest = pf_bdf.split(":")
    dev, fn = rest.split(".")
    rid = (int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn)) + offset + stride * index
    return f"{domain}:{rid >> 8 & 0xFF:02x}:{rid >> 3 & 0x1F:02x}.{rid & 7}"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError):
        return None


def _read_int_hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def on_demand(sysfs_root: Path, nics: Sequence[Device]) -> tuple[list[CounterSet], list[Device]]:
    """The counter set of every offered SR-IOV PF and ``nics`` as ``--vfs dynamic`` offers
    them: a PF with no VFs gains its candidates, each consuming one ``vfs`` of TotalVFs; a PF
    whose VFs exist, its VFs each consuming one of NumVFs (the count the agent made, so the
    set stays what it was across the pre-sizing). The PF itself consumes the whole set: a
    PF's holder controls every VF of it (``ip link set <pf> vf N ...``, and its netdev
    leaving the host takes the VFs' caps and MAC resets with it), so the scheduler never
    hands out a PF and any of its VFs at once (#28, finding 4)."""
    sets: list[CounterSet] = []
    made: list[Device] = []
    whole: dict[str, tuple[str, str]] = {}  # PF address -> (its set, the whole count)
    for pf in nics:
        if pf.type != DeviceType.NIC or not pf.host.pci_address:
            continue
        base = sysfs_root / "bus" / "pci" / "devices" / pf.host.pci_address
        total, num = _read_int(base / "sriov_totalvfs"), _read_int(base / "sriov_numvfs")
        offset, stride = _read_int(base / "sriov_offset"), _read_int(base / "sriov_stride")
        if not total or num is None:
            continue  # no SR-IOV, or unreadable
        if num == 0 and (offset is None or stride is None):
            continue  # where its VFs would be is unknown: none offered
        set_name = counter_set_name(pf.name)
        count = str(num or total)
        sets.append(CounterSet(set_name, {COUNTER: count}))
        whole[pf.host.pci_address] = (set_name, count)
        if num == 0:
            assert offset is not None and stride is not None
            made += _candidates(base, pf, set_name=set_name, total=total, offset=offset,
                                stride=stride)
    out: list[Device] = []
    for device in nics:
        key = device.host.parent_pf if device.type == DeviceType.VF else (
            device.host.pci_address if device.type == DeviceType.NIC else None)
        if key not in whole:
            out.append(device)
            continue
        set_name, count = whole[key or ""]
        out.append(replace(device, consumes=(*device.consumes, CounterConsumption(
            set_name, {COUNTER: count if device.type == DeviceType.NIC else "1"}))))
    return sets, out + made


def _candidates(base: Path, pf: Device, *, set_name: str, total: int, offset: int,
                stride: int) -> list[Device]:
    """The ``total`` VFs ``pf`` could have, named and addressed as the kernel will make them."""
    assert pf.host.pci_address
    shared: dict[str, AttributeValue] = {
        k: v for k, v in pf.attributes.items() if k in _COPIED}
    shared.update(isVF=True, parentPF=pf.host.pci_address, partition=True)
    vf_device = _read_int_hex(base / "sriov_vf_device")
    if vf_device is not None:
        shared["pciDeviceID"] = f"{vf_device:04x}"
    out = []
    for index in range(total):
        bdf = vf_address(pf.host.pci_address, offset, stride, index)
        attrs = {**shared, "vfIndex": index, PCI_BUS_ID: bdf}
        host = HostInfo(pci_address=bdf, vendor=pf.host.vendor, parent_pf=pf.host.pci_address,
                        extra={EXTRA_CANDIDATE: str(index), EXTRA_TOTAL: str(total)})
        out.append(Device(pci_name("vf", bdf), DeviceType.VF, attrs, {}, host,
                          consumes=(CounterConsumption(set_name, {COUNTER: "1"}),)))
    return out


def with_bandwidth(sysfs_root: Path, devices: Sequence[Device], sets: Sequence[CounterSet],
                   mbps: int, warnings: list[str]) -> tuple[list[CounterSet], list[Device]]:
    """``devices`` and ``sets`` with every VF the link carries consuming ``mbps`` of it; the
    others dropped (all of a PF whose link cannot carry one, with a warning)."""
    by_name = {s.name: s for s in sets}
    links: dict[str, int | None] = {}
    out: list[Device] = []
    for device in devices:
        pf = device.host.parent_pf
        if device.type != DeviceType.VF or not pf:
            out.append(device)
            continue
        if pf not in links:
            links[pf] = _link_mbps(sysfs_root, pf)
            link = links[pf]
            if link is None or link < mbps:
                warnings.append(
                    f"VFs of PF {pf} not offered: each is guaranteed {rate_quantity(mbps)} "
                    f"(--vf-bandwidth) and the link " + (
                        "is down or its speed unknown" if link is None
                        else f"runs at {rate_quantity(link)}"))
        link = links[pf]
        index = device.attributes.get("vfIndex")
        if link is None or link < mbps or not isinstance(index, int) or index >= link // mbps:
            continue  # not offered: no VF index to cap by is as unusable as no room
        set_name = counter_set_name(pci_name("nic", pf))
        have = by_name.get(set_name)
        by_name[set_name] = CounterSet(set_name, {**(have.counters if have else {}),
                                                  BANDWIDTH: rate_quantity(link)})
        consumes = [c for c in device.consumes if c.counter_set != set_name]
        mine = next((c.counters for c in device.consumes if c.counter_set == set_name), {})
        consumes.append(CounterConsumption(set_name, {**mine, BANDWIDTH: rate_quantity(mbps)}))
        out.append(replace(
            device, consumes=tuple(consumes),
            capacity={**device.capacity, BANDWIDTH: rate_quantity(mbps)},
            host=replace(device.host, extra={**device.host.extra, EXTRA_RATE: str(mbps)})))
    return list(by_name.values()), [_whole_link(d, by_name) for d in out]


def _whole_link(device: Device, sets: Mapping[str, CounterSet]) -> Device:
    """A PF whose VFs are guaranteed bandwidth consumes all of it (``on_demand`` says why):
    its own traffic has no share to keep to."""
    if device.type != DeviceType.NIC:
        return device
    link = sets.get(counter_set_name(device.name))
    if link is None or BANDWIDTH not in link.counters:
        return device
    return replace(device, consumes=tuple(
        replace(c, counters={**c.counters, BANDWIDTH: link.counters[BANDWIDTH]})
        if c.counter_set == link.name else c for c in device.consumes))


def _link_mbps(sysfs_root: Path, pf: str) -> int | None:
    """The negotiated speed of ``pf``'s netdev (sysfs ``speed``, Mb/s; -1 while down)."""
    nets = sysfs_root / "bus" / "pci" / "devices" / pf / "net"
    for net in sorted(nets.iterdir()) if nets.is_dir() else ():
        speed = _read_int(net / "speed")
        operstate = (net / "operstate").read_text().strip() if (net / "operstate").is_file() \
            else "up"
        if speed is not None and speed > 0 and operstate in ("up", "unknown"):
            return speed
    return None


class SriovError(Exception):
    """A change of ``sriov_numvfs`` the kernel refused; names the PF and the cause."""


class SriovControl(Protocol):
    """The SR-IOV changes the agent makes: a PF's VF count (0 -> N), a VF's driver."""

    def num_vfs(self, pf: str) -> int: ...
    def set_num_vfs(self, pf: str, count: int) -> None: ...
    def exists(self, function: str) -> bool: ...
    def driver(self, function: str) -> str | None: ...
    def has_driver(self, driver: str) -> bool: ...
    def bind(self, function: str, driver: str) -> None: ...
    def reset_vf_mac(self, pf: str, index: int) -> None: ...
    def set_vf_rate(self, pf: str, index: int, max_mbps: int) -> None: ...


class SysfsSriov:
    """The kernel's ``/sys/bus/pci/devices/<pf>/sriov_numvfs``. The write returns once the
    VFs are enumerated; their drivers probe after, so it waits (bounded) for the last one."""

    def __init__(self, sysfs_root: Path, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs_root = sysfs_root
        self.timeout_s = timeout_s
        self.clock = clock
        self._drivers = SysfsPciDrivers(sysfs_root, kind="VF")

    def _pf(self, pf: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / pf

    def num_vfs(self, pf: str) -> int:
        value = _read_int(self._pf(pf) / "sriov_numvfs")
        if value is None:
            raise SriovError(f"PF {pf}: no readable sriov_numvfs (SR-IOV disabled?)")
        return value

    def exists(self, function: str) -> bool:
        return self._pf(function).is_dir()

    def driver(self, function: str) -> str | None:
        return self._drivers.driver(function)

    def has_driver(self, driver: str) -> bool:
        """``driver`` is a PCI driver the kernel has (``/sys/bus/pci/drivers/<driver>``)."""
        return self._drivers.has_driver(driver)

    def bind(self, function: str, driver: str) -> None:
        """``driver_override``, unbind from the current driver, ``drivers_probe``
        (``SysfsPciDrivers.bind``, as GPU passthrough rebinds)."""
        try:
            self._drivers.bind(function, driver)
        except PciDriverError as err:
            raise SriovError(str(err)) from err

    def reset_vf_mac(self, pf: str, index: int) -> None:
        """Unset VF ``index``'s MAC on its PF (``ip link set <pf> vf <index> mac 00:..:00``),
        through rtnetlink: what a pod set does not follow the VF to the next one."""
        self._setlink(pf, f"resetting VF {index}'s MAC",
                      lambda ifindex: vf_info_message(ifindex, IFLA_VF_MAC,
                                                      struct.pack("=I32s", index, b"")))

    def set_vf_rate(self, pf: str, index: int, max_mbps: int) -> None:
        """Cap VF ``index`` at ``max_mbps`` (0: no cap), ``ip link set <pf> vf <index>
        max_tx_rate``: the kernel's IFLA_VF_RATE, no guaranteed minimum."""
        what = f"capping VF {index} at {max_mbps} Mbit/s" if max_mbps \
            else f"lifting VF {index}'s rate cap"
        self._setlink(pf, what, lambda ifindex: vf_info_message(
            ifindex, IFLA_VF_RATE, struct.pack("=III", index, 0, max_mbps)))

    def _setlink(self, pf: str, what: str, message: Callable[[int], bytes]) -> None:
        nets = sorted(p.name for p in (self._pf(pf) / "net").glob("*"))
        if not nets:
            raise SriovError(f"PF {pf} has no network interface for {what}")
        ifindex = _read_int(self.sysfs_root / "class" / "net" / nets[0] / "ifindex")
        if ifindex is None:
            raise SriovError(f"PF {pf}: no ifindex for {nets[0]}")
        try:
            send_netlink(message(ifindex))
        except OSError as err:
            raise SriovError(f"PF {pf} ({nets[0]}): {what} over netlink: "
                             f"{err.strerror or err}") from err

    def set_num_vfs(self, pf: str, count: int) -> None:
        path = self._pf(pf) / "sriov_numvfs"
        try:
            path.write_text(f"{count}\n")
        except OSError as err:
            why = err.strerror or str(err)
            if err.errno == errno.EBUSY:
                why += " (the kernel changes the VF count only from 0)"
            raise SriovError(f"PF {pf}: writing {count} to {path}: {why}") from err
        last = self._pf(pf) / f"virtfn{count - 1}" / "driver"
        deadline = self.clock() + self.timeout_s
        while count and not last.exists():
            if self.clock() > deadline:
                raise SriovError(f"PF {pf}: VF {count - 1} has no driver {self.timeout_s:g} s "
                                 "after the VFs were created")
            time.sleep(0.05)


RTM_SETLINK = 19
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
IFLA_VFINFO_LIST, IFLA_VF_INFO, IFLA_VF_MAC, IFLA_VF_RATE = 22, 1, 1, 6
NLA_F_NESTED = 0x8000


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def vf_info_message(ifindex: int, kind: int, payload: bytes, seq: int = 1) -> bytes:
    """RTM_SETLINK for ``ifindex`` with IFLA_VFINFO_LIST > IFLA_VF_INFO > ``kind``, asking
    for an ack. IFLA_VF_MAC carries ``struct ifla_vf_mac {__u32 vf; __u8 mac[32];}``,
    IFLA_VF_RATE ``struct ifla_vf_rate {__u32 vf; __u32 min_tx_rate; __u32 max_tx_rate;}``."""
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0) + _attr(
        IFLA_VFINFO_LIST | NLA_F_NESTED, _attr(IFLA_VF_INFO | NLA_F_NESTED,
                                               _attr(kind, payload)))
    return struct.pack("=IHHII", 16 + len(body), RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK,
                       seq, 0) + body


def vf_mac_message(ifindex: int, vf: int, mac: bytes, seq: int = 1) -> bytes:
    """The message setting VF ``vf``'s MAC (zeros: unset)."""
    return vf_info_message(ifindex, IFLA_VF_MAC, struct.pack("=I32s", vf, mac), seq)


def send_netlink(message: bytes, timeout_s: float = 5.0) -> None:
    """Send one rtnetlink request and wait for its ack; OSError with the kernel's errno."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        sock.send(message)
        reply = sock.recv(65536)
    if len(reply) < 20:
        raise OSError(errno.EIO, "short netlink reply")
    _, kind = struct.unpack_from("=IH", reply)
    code = struct.unpack_from("=i", reply, 16)[0] if kind == NLMSG_ERROR else 0
    if code:
        raise OSError(-code, os.strerror(-code))
