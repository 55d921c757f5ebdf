"""Human views of an Inventory: the ``discover`` table and the ``--topology`` tree.

Both return text (no printing), so the command stays thin and tests read the same strings
an operator sees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from discovery.model import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, Device, DeviceType, Inventory
from discovery.names import natural_key
from discovery.sharing import SHARES, SHARING_ATTRIBUTE, enforcement

TABLE_COLUMNS = ("NAME", "TYPE", "MODEL", "PCI", "NUMA", "PCIE-ROOT", "SWITCH", "DETAILS")
WIDE_COLUMNS = (*TABLE_COLUMNS[:-1], "DRIVER", "UUID/MAC", "DETAILS")


def _attr(device: Device, key: str) -> str:
    value = device.attributes.get(key)
    if value is None:
        return "-"
    if isinstance(value, tuple):  # an int list (numaNode's list form)
        return ",".join(str(v) for v in value)
    return str(getattr(value, "value", value))


def model(device: Device) -> str:
    if device.type in (DeviceType.GPU, DeviceType.MIG) and "productName" in device.attributes:
        return _attr(device, "productName")
    vendor = device.attributes.get("vendor", "")
    ids = f"{_attr(device, 'pciVendorID')}:{_attr(device, 'pciDeviceID')}"
    return f"{vendor} {ids}".strip()


def details(device: Device) -> str:
    a = device.attributes
    parts: list[str] = []
    if device.type == DeviceType.MIG:
        parts.append(f"profile={a.get('profile')}")
        parts.append(f"placement={a.get('placementStart')}+{a.get('placementSize')}")
        parts.append(f"parent=gpu-{a.get('parentMinor')}")
    if device.allow_multiple_allocations:
        parts.append(f"shared={share_summary(device)}")
    if "memory" in device.capacity:
        parts.append(f"memory={device.capacity['memory']}")
    if "multiprocessors" in device.capacity:
        parts.append(f"sm={device.capacity['multiprocessors']}")
    for key, label in (("ifName", "if"), ("rdmaDevice", "rdma"),
                       ("parentPF", "pf"), ("cardIndex", "card"), ("renderIndex", "render")):
        if key in a:
            parts.append(f"{label}={_attr(device, key)}")
    if "operstate" in device.host.extra:
        parts.append(f"state={device.host.extra['operstate']}")
    if device.host.extra.get("speedMbps", "").isdigit():
        parts.append(f"speed={int(device.host.extra['speedMbps']) // 1000}G")
    if "sriovTotalVFs" in a:
        parts.append(f"vfs={a.get('sriovNumVFs')}/{a['sriovTotalVFs']}")
    if device.type == DeviceType.VF and "bandwidth" in device.capacity:  # --vf-bandwidth
        parts.append(f"guaranteed={device.capacity['bandwidth']}")
    if device.host.driver == "vfio-pci":
        parts.append(f"vfio-group={device.host.iommu_group}")
    elif device.type == DeviceType.VFIO:  # --gpu-passthrough: bound to vfio-pci at prepare
        parts.append(f"iommu-group={device.host.iommu_group or 'none'} bound-at-prepare")
    if a.get("partition") is True:
        parts.append("made-at-prepare")  # --mig/--vfs dynamic
    return " ".join(p for p in parts if p)


def _row(device: Device, wide: bool) -> list[str]:
    base = [
        device.name, str(device.type), model(device), _attr(device, PCI_BUS_ID),
        _attr(device, NUMA_NODE), _attr(device, PCIE_ROOT), _attr(device, "pcieSwitch"),
    ]
    if wide:
        ident = _attr(device, "uuid") if "uuid" in device.attributes else _attr(
            device, "macAddress")
        base += [device.host.driver or "-", ident]
    return [*base, details(device)]


def share_summary(device: Device) -> str:
    """How a shareable device is handed out: ``shares:4``, ``memory/10Gi``."""
    kind = device.attributes.get(SHARING_ATTRIBUTE)
    if kind == SHARES:
        return f"{SHARES}:{device.capacity.get(SHARES, '?')}"
    policy = device.request_policies.get(str(kind))
    return f"{kind}/{policy.step if policy is not None else '?'}"


def format_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]
    return "\n".join(lines)


def table(inventory: Inventory, wide: bool = False) -> str:
    """kubectl-style table of offered devices, then the reserved ones with their reason."""
    header = WIDE_COLUMNS if wide else TABLE_COLUMNS
    out = format_rows(header, [_row(d, wide) for d in inventory.devices]) \
        if inventory.devices else "No devices to offer."
    shared: dict[str, list[str]] = defaultdict(list)
    for device in inventory.devices:
        if wide and device.allow_multiple_allocations:
            shared[f"{share_summary(device)}: {enforcement(device)}"].append(device.name)
    if shared:
        out += "\n\n" + format_rows(
            ("SHARED", "ENFORCED BY"),
            [[_names(names), text] for text, names in shared.items()],
        )
    if inventory.reserved:
        out += "\n\n" + format_rows(
            ("RESERVED", "REASON"), [[k, v] for k, v in inventory.reserved.items()]
        )
    return out


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} more)"


def _leaf(device: Device) -> str:
    extra = details(device)
    return f"{device.name} ({device.type}) {model(device)} {_attr(device, PCI_BUS_ID)}" + (
        f"  {extra}" if extra else "")


def topology(inventory: Inventory, node_name: str) -> str:
    """NUMA node -> PCIe root -> switch -> devices, so GPU/NIC neighbours are obvious."""
    tree: dict[str, dict[str, dict[str, list[Device]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for device in inventory.devices:
        numa = device.attributes.get(NUMA_NODE)
        numa = numa[0] if isinstance(numa, tuple) else numa  # grouped by the physical node
        numa_label = f"NUMA {numa}" if numa is not None else "NUMA unknown"
        root = _attr(device, PCIE_ROOT)
        root_label = root if root != "-" else "no PCI root"
        switch = device.attributes.get("pcieSwitch")
        tree[numa_label][root_label][f"switch {switch}" if switch else ""].append(device)
    lines = [f"node {node_name}"]

    def emit(prefix: str, last: bool, text: str) -> str:
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{text}")
        return prefix + ("   " if last else "│  ")

    numas = sorted(tree, key=natural_key)
    for i, numa_label in enumerate(numas):
        p1 = emit("", i == len(numas) - 1, numa_label)
        roots = sorted(tree[numa_label], key=natural_key)
        for j, root_label in enumerate(roots):
            p2 = emit(p1, j == len(roots) - 1, root_label)
            switches = sorted(tree[numa_label][root_label], key=natural_key)
            for k, switch_label in enumerate(switches):
                devices = tree[numa_label][root_label][switch_label]
                p3 = p2
                if switch_label:
                    p3 = emit(p2, k == len(switches) - 1, switch_label)
                for m, device in enumerate(devices):
                    is_last = m == len(devices) - 1 and (
                        bool(switch_label) or k == len(switches) - 1)
                    emit(p3, is_last, _leaf(device))
    if not inventory.devices:
        lines.append("└─ (no devices to offer)")
    for name, reason in inventory.reserved.items():
        lines.append(f"   reserved: {name} ({reason})")
    return "\n".join(lines)
