"""The parts every simulated node is built from: the ``Node`` a profile fills in (its sysfs
builder, fake GPUs, /dev nodes and routes), PCI vendor and class ids, and the pieces several
machines share (ConnectX functions with their netdev and RDMA device, the management NIC
that carries the default route, the virtual interfaces discovery must ignore).
"""

from __future__ import annotations

from dataclasses import dataclass

from discovery.simulate.fake_nvml import FakeGpu
from discovery.simulate.tree import PciSpec, SysfsBuilder

MELLANOX, NVIDIA, INTEL, BROADCOM = 0x15B3, 0x10DE, 0x8086, 0x1000
CLASS_ETH, CLASS_IB, CLASS_3D = 0x020000, 0x020700, 0x030200


@dataclass
class Node:
    """Everything a profile writes; turned into files by ``simulated_sources``."""

    sys: SysfsBuilder
    gpus: list[FakeGpu]
    dev_nodes: list[str]
    routes: list[tuple[str, str, str]]  # iface, destination hex, mask hex (/proc/net/route)
    driver: str = "550.54.15"


def bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


def _ib_addr(guid: str) -> str:
    raw = "00000829fe800000" + "0000" + "0000" + guid.replace(":", "")
    return ":".join(raw[i : i + 2] for i in range(0, 40, 2))


def mac(seed: int) -> str:
    return "58:a2:e1:" + ":".join(f"{(seed >> s) & 0xFF:02x}" for s in (16, 8, 0))


def netfiles(addr: str, mtu: int, speed: int, link_type: int, up: bool = True) -> dict[str, str]:
    return {
        "address": addr, "mtu": str(mtu), "speed": str(speed if up else -1),
        "operstate": "up" if up else "down", "carrier": "1" if up else "0",
        "type": str(link_type),
    }


def common_virtual(node: Node) -> None:
    """Interfaces every Linux node has and discovery must ignore."""
    node.sys.virtual_net("lo", {"address": "00:00:00:00:00:00", "mtu": "65536",
                                "operstate": "unknown", "type": "772"})
    node.sys.virtual_net("docker0", netfiles("02:42:ac:11:00:01", 1500, -1, 1, up=False))
    node.sys.virtual_net("veth1a2b3c", netfiles("6a:1f:00:00:00:01", 1500, 10000, 1))
    node.sys.bridge("pci0000:00", (), bdf(0), vendor=INTEL, device=0x09A2)  # host bridge


def mgmt_nic(node: Node, bus: int, ifname: str, numa: int, cpus: str) -> None:
    """An on-board Intel port carrying the default route: must be reserved, never offered."""
    root = f"pci0000:{bus - 1:02x}"
    port = bdf(bus - 1, 1)
    node.sys.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)
    dev = node.sys.function(PciSpec(bdf(bus), root, (port,), INTEL, 0x1563, CLASS_ETH,
                                    (INTEL, 0x35D4), numa, cpus, "ixgbe", "8.0 GT/s PCIe", 4))
    node.sys.net(dev, ifname, netfiles("3c:ec:ef:00:00:01", 1500, 10000, 1))
    node.routes += [(ifname, "00000000", "00000000"), (ifname, "000A0A0A", "00FFFFFF")]


def connectx(node: Node, spec: PciSpec, ifname: str, ibdev: int, *, ib: bool, speed: int,
             hca: str) -> None:
    dev = node.sys.function(spec)
    guid = f"58a2:e103:00{ibdev:02x}:{int(spec.bdf[5:7], 16):02x}76"
    addr = _ib_addr(guid) if ib else mac(ibdev * 256 + int(spec.bdf[5:7], 16))
    node.sys.net(dev, ifname, netfiles(addr, 4092 if ib else 9000, speed, 32 if ib else 1))
    rate = f"{speed // 1000} Gb/sec (4X {'NDR' if speed >= 400000 else 'HDR'})"
    node.sys.rdma(dev, f"mlx5_{ibdev}", uverbs=ibdev,
                  link_layer="InfiniBand" if ib else "Ethernet", rate=rate, guid=guid, hca=hca)
    node.dev_nodes.append(f"infiniband/uverbs{ibdev}")
