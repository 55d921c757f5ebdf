"""The device model shared by discovery, the slice controller, the plugin and explain.

Two layers live here:

* ``Device`` is what discovery found on this node: the published view (name, attributes,
  capacity, taints) plus ``HostInfo``, the host facts the plugin needs to prepare the device
  (device nodes, interface names, IOMMU group...). Host facts are never published.
* ``DriverResources`` / ``Pool`` / ``Slice`` mirror the upstream resourceslice controller's
  input: what should exist in the cluster, as resource.k8s.io/v1 ``Device`` dicts. The
  controller converts them to older API versions when the server needs that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

#: Domain of the standard attributes every PCI device carries.
STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"


class DeviceType(StrEnum):
    """Value of the ``type`` attribute; the shipped DeviceClasses select on it."""

    GPU = "gpu"
    MIG = "mig"
    NIC = "nic"
    VF = "vf"
    #: A whole GPU for a VM, bound to vfio-pci at prepare (``--gpu-passthrough``,
    #: discovery.passthrough).
    VFIO = "vfio"


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version attribute value (published as ``{"version": ...}``)."""

    value: str


#: A tuple is an int list (``{"ints": [...]}``, Kubernetes 1.37's DRAListTypeAttributes). Its
#: first element is what the attribute says as a scalar where the server takes no lists
#: (numaNode: the physical node), so every list attribute has a scalar form.
AttributeValue = bool | int | str | Version | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint as published in the ResourceSlice (``key``, ``value``, ``effect``)."""

    key: str
    effect: str = "NoSchedule"
    value: str = ""
    time_added: str | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """How one capacity of a shareable device is consumed (KEP-5075 ``requestPolicy``).

    Quantities are strings as published. ``default`` is what a request that names no amount
    consumes; ``valid_values`` (ascending) or the ``min``/``max``/``step`` range says what a
    request may consume (the scheduler rounds a request up to the next valid amount).
    """

    default: str
    valid_values: tuple[str, ...] = ()
    min: str | None = None
    max: str | None = None
    step: str | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"default": self.default}
        if self.valid_values:
            out["validValues"] = list(self.valid_values)
        elif self.min is not None:
            rng: dict[str, Any] = {"min": self.min}
            if self.max is not None:
                rng["max"] = self.max
            if self.step is not None:
                rng["step"] = self.step
            out["validRange"] = rng
        return out


@dataclass(frozen=True, slots=True)
class CounterSet:
    """A pool's shared counters (KEP-4815 ``sharedCounters``): counter name -> quantity.

    Published in slices of their own (1.35+); devices that ``consume`` from it are never
    allocated together beyond these totals.
    """

    name: str
    counters: Mapping[str, str]

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name,
                "counters": {k: {"value": self.counters[k]} for k in sorted(self.counters)}}


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """What one device takes from a counter set when allocated (``consumesCounters``)."""

    counter_set: str
    counters: Mapping[str, str]

    def to_api(self) -> dict[str, Any]:
        return {"counterSet": self.counter_set,
                "counters": {k: {"value": self.counters[k]} for k in sorted(self.counters)}}


@dataclass(frozen=True, slots=True)
class HostInfo:
    """Host-side facts needed to prepare a device; not part of the published object.

    Paths are host paths (relative to ``/``), even when discovery read a simulated sysfs tree.
    """

    pci_address: str | None = None
    vendor: str | None = None  # "nvidia", "amd", "intel", "mellanox", ...
    uuid: str | None = None  # GPU or MIG UUID
    parent_uuid: str | None = None  # MIG: the parent GPU's UUID
    minor: int | None = None  # /dev/nvidia<minor>
    mig_gi: int | None = None  # MIG GPU instance id
    mig_ci: int | None = None  # MIG compute instance id
    if_name: str | None = None  # network interface on the host
    rdma_device: str | None = None  # e.g. mlx5_0
    dev_nodes: tuple[str, ...] = ()  # device nodes this device needs (/dev/...)
    iommu_group: str | None = None  # VFIO group number when bound to vfio-pci
    driver: str | None = None  # bound kernel driver
    parent_pf: str | None = None  # VF: PCI address of its physical function
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Device:
    """One allocatable device of this node, in the resource.k8s.io model."""

    name: str
    type: DeviceType
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, str]  # name -> quantity string ("80Gi", "132")
    host: HostInfo = field(default_factory=HostInfo)
    taints: tuple[Taint, ...] = ()
    #: Shareable (``--sharing``, discovery/sharing.py): the scheduler may allocate the device
    #: to several requests at once, each consuming part of its capacity by ``request_policies``.
    allow_multiple_allocations: bool = False
    request_policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    consumes: tuple[CounterConsumption, ...] = ()  # a partition of shared counters

    def to_api(self, list_attributes: bool = False) -> dict[str, Any]:
        """The resource.k8s.io/v1 ``Device`` dict, with keys in a deterministic order; list
        values in their scalar form unless the server takes ``list_attributes``."""
        attrs: dict[str, Any] = {"type": {"string": str(self.type)}}
        for key in sorted(self.attributes):
            attrs[key] = attribute_to_api(self.attributes[key], list_attributes)
        out: dict[str, Any] = {"name": self.name, "attributes": dict(sorted(attrs.items()))}
        if self.capacity:
            out["capacity"] = {k: self._capacity_to_api(k) for k in sorted(self.capacity)}
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.consumes:
            out["consumesCounters"] = [c.to_api() for c in self.consumes]
        if self.taints:
            out["taints"] = [t.to_api() for t in self.taints]
        return out

    def _capacity_to_api(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.capacity[name]}
        policy = self.request_policies.get(name)
        if policy is not None:
            out["requestPolicy"] = policy.to_api()
        return out


def attribute_to_api(value: AttributeValue, list_attributes: bool = False) -> dict[str, Any]:
    """Encode one attribute value as the API's one-of (bool/int/string/version, or ints)."""
    if isinstance(value, tuple):
        return {"ints": list(value)} if list_attributes else {"int": value[0]}
    if isinstance(value, Version):
        return {"version": value.value}
    if isinstance(value, bool):  # before int: bool is an int subclass
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


@dataclass(frozen=True, slots=True)
class Slice:
    """One ResourceSlice's worth of devices (v1 ``Device`` dicts) and shared counters."""

    devices: tuple[Mapping[str, Any], ...]
    shared_counters: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool as the controller publishes it.

    ``generation`` is a floor: the controller bumps it whenever a change needs more than one
    write. ``node_selector`` (a v1 NodeSelector dict) replaces the Node owner for
    network-attached devices; ``all_nodes`` says so for devices every node reaches (never
    implied by the absence of the other two, as upstream's controller does not either).
    """

    slices: tuple[Slice, ...]
    node_selector: Mapping[str, Any] | None = None
    generation: int = 0
    all_nodes: bool = False


@dataclass(frozen=True, slots=True)
class DriverResources:
    """Everything the driver wants published: pool name -> pool.

    ``list_pools`` are the same pools with list-valued attributes in list form (and sliced
    for that form's limits), published instead of ``pools`` where the API server takes
    list attributes; None when the driver has no list attribute to offer.
    """

    pools: Mapping[str, Pool]
    list_pools: Mapping[str, Pool] | None = None

    def in_form(self, list_attributes: bool) -> DriverResources:
        """The resources to publish to a server that does (or does not) take lists."""
        if list_attributes and self.list_pools is not None:
            return DriverResources(self.list_pools)
        return DriverResources(self.pools)


@dataclass(frozen=True, slots=True)
class Inventory:
    """What discovery found: devices by name plus the sources that could not be read."""

    devices: tuple[Device, ...]
    warnings: tuple[str, ...] = ()
    #: Devices found but deliberately not offered (e.g. the NIC carrying the default route),
    #: name -> reason; shown by ``dra-agent discover`` so operators know why.
    reserved: Mapping[str, str] = field(default_factory=dict)
    #: Shared counters the devices' ``consumes`` draw from (dynamic MIG partitions).
    counter_sets: tuple[CounterSet, ...] = ()

    def by_name(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    def in_form(self, list_attributes: bool) -> Inventory:
        """This inventory as a server without list attributes sees it (list values replaced
        by their scalar form), or unchanged when lists are taken."""
        if list_attributes:
            return self
        devices = tuple(
            replace(d, attributes={k: v[0] if isinstance(v, tuple) else v
                                   for k, v in d.attributes.items()})
            if any(isinstance(v, tuple) for v in d.attributes.values()) else d
            for d in self.devices
        )
        return replace(self, devices=devices)
