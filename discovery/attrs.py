"""Attribute helpers shared by the GPU and NIC scanners: standard PCI attributes, quantities,
semver normalisation and the API limits every device must fit.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping

from discovery.model import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, AttributeValue, Device
from discovery.sysfs import PciFunction, switch_of

log = logging.getLogger("discovery.attrs")

MAX_ATTRIBUTES = 32  # attributes + capacities per device, including "type"
MAX_STRING = 64
MAX_VALUES = 48  # attribute values per device, each list item counted ("type" included)

#: PCI vendor id -> the ``vendor`` value we publish.
VENDORS = {
    0x10DE: "nvidia",
    0x1002: "amd",
    0x8086: "intel",
    0x15B3: "mellanox",
    0x14E4: "broadcom",
    0x1AF4: "virtio",
    0x1D0F: "amazon",
    0x1077: "qlogic",
    0x19E5: "huawei",
    0x1924: "solarflare",
    0x8088: "wangxun",
}

#: Attributes dropped first when a device would exceed the API's 32 entries.
_OPTIONAL_ORDER = ("pciDeviceID", "pciVendorID", "driver", "vendor")
#: Never dropped while anything else can go: identity and topology (plus every qualified name).
_KEEP = frozenset({"uuid", "productName", "profile", "parentUUID", "minor", "index", "ifName",
                   "rdmaDevice", "isVF", "parentPF", "pcieSwitch", "sharing",
                   "nvlinkDomain", "nvlinkClique"})


def vendor_name(vendor_id: int | None) -> str | None:
    if vendor_id is None:
        return None
    return VENDORS.get(vendor_id, f"{vendor_id:04x}")


def pci_attributes(
    fn: PciFunction | None, below: Mapping[str, frozenset[str]]
) -> dict[str, AttributeValue]:
    """The standard attributes plus our ``pcieSwitch`` and the PCI identity of a function."""
    if fn is None:
        return {}
    out: dict[str, AttributeValue] = {PCI_BUS_ID: fn.bdf}
    if fn.pcie_root:
        out[PCIE_ROOT] = fn.pcie_root
    if fn.numa_nodes:
        out[NUMA_NODE] = fn.numa_nodes  # list form; the scalar is its first element
    switch = switch_of(fn, below)
    if switch:
        out["pcieSwitch"] = switch
    if fn.vendor is not None:
        out["pciVendorID"] = f"{fn.vendor:04x}"
    if fn.device is not None:
        out["pciDeviceID"] = f"{fn.device:04x}"
    if fn.driver:
        out["driver"] = fn.driver
    return out


def quantity(num_bytes: int) -> str:
    """Bytes as the shortest exact Kubernetes quantity (``80Gi``, ``81559Mi``, ``123``)."""
    for suffix, unit in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


_NUM = re.compile(r"\d+")


def semver(text: str) -> str | None:
    """Normalise a driver-style version (``535.129.03``, ``560.28``) to semver 2.0.0.

    Semver forbids leading zeros and needs three parts; anything without a number is None.
    """
    parts = _NUM.findall(text)
    if not parts:
        return None
    nums = [str(int(p)) for p in parts[:3]]
    while len(nums) < 3:
        nums.append("0")
    return ".".join(nums)


def fit_limits(device: Device) -> Device:
    """Make a device valid for the API: strings cut to 64 chars, at most 32 entries and 48
    values.

    Both cases are logged with the device name; they mean a source returned something odd.
    """
    attrs = dict(device.attributes)
    for key, value in list(attrs.items()):
        if isinstance(value, str) and len(value) > MAX_STRING:
            log.warning("attribute value truncated to 64 characters",
                        extra={"device": device.name, "attribute": key})
            attrs[key] = value[:MAX_STRING]
    budget = MAX_ATTRIBUTES - 1 - len(device.capacity)  # "type" is always published
    for key in _OPTIONAL_ORDER:
        if len(attrs) <= budget:
            break
        if key in attrs:
            del attrs[key]
            log.warning("attribute dropped to stay within 32 per device",
                        extra={"device": device.name, "attribute": key})
    while len(attrs) > budget:
        droppable = sorted(k for k in attrs if "/" not in k and k not in _KEEP) or sorted(attrs)
        key = droppable[-1]
        del attrs[key]
        log.warning("attribute dropped to stay within 32 per device",
                    extra={"device": device.name, "attribute": key})
    # A list (numaNode's) counts each item: shortened from its end, its first item (the
    # scalar meaning) always kept. Only a machine of many equidistant nodes gets here.
    over = 1 + sum(len(v) if isinstance(v, tuple) else 1 for v in attrs.values()) - MAX_VALUES
    for key, value in sorted(attrs.items()):
        if over <= 0:
            break
        if isinstance(value, tuple) and len(value) > 1:
            keep = max(1, len(value) - over)
            over -= len(value) - keep
            attrs[key] = value[:keep]
            log.warning("attribute list shortened to stay within 48 values per device",
                        extra={"device": device.name, "attribute": key, "kept": keep})
    if attrs == dict(device.attributes):
        return device
    return dataclasses.replace(device, attributes=attrs)
