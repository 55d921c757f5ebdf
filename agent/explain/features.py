"""The kube-scheduler feature gates that change what the DRA allocator does, with their defaults
per Kubernetes version (pkg/features/kube_features.go), and ``--feature-gates`` parsing.

Only gates read by the allocator's ``Features`` struct are modelled: the others do not change
which devices a claim gets. DeviceBindingAndStatus is on only when both of its gates are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.explain.docs import InputError

#: The Kubernetes release whose scheduler explain replays by default.
MODELLED_KUBERNETES = "1.37"

#: gate name -> Features field it drives (DRAResourceClaimDeviceStatus is AND-ed in).
GATES: Mapping[str, str] = {
    "DRAAdminAccess": "admin_access",
    "DRAConsumableCapacity": "consumable_capacity",
    "DRADeviceBindingConditions": "binding_conditions",
    "DRAResourceClaimDeviceStatus": "claim_device_status",
    "DRADeviceTaints": "device_taints",
    "DRAFractionalCapacityRange": "fractional_capacity_range",
    "DRAListTypeAttributes": "list_type_attributes",
    "DRAPartitionableDevices": "partitionable_devices",
    "DRAPrioritizedList": "prioritized_list",
}
#: Gates that cannot be turned off in that release (LockToDefault).
_LOCKED: Mapping[str, frozenset[str]] = {
    "1.37": frozenset({"DRAAdminAccess", "DRAPrioritizedList", "DRAResourceClaimDeviceStatus"}),
    "1.35": frozenset(),
}


@dataclass(frozen=True, slots=True)
class Features:
    admin_access: bool = True
    consumable_capacity: bool = True
    binding_conditions: bool = True
    claim_device_status: bool = True
    device_taints: bool = True
    fractional_capacity_range: bool = False
    list_type_attributes: bool = False
    partitionable_devices: bool = True
    prioritized_list: bool = True

    @property
    def binding_and_status(self) -> bool:
        return self.binding_conditions and self.claim_device_status

    def enabled(self) -> dict[str, bool]:
        """gate name -> on/off, for the report."""
        return {gate: bool(getattr(self, attr)) for gate, attr in GATES.items()}


#: Defaults per release. 1.37: on but DRAListTypeAttributes (alpha) and
#: DRAFractionalCapacityRange (on only with --min-compatibility-version=1.37, which defaults to
#: 1.36); 1.35: the betas are on, the alphas (taints, partitionable, consumable, binding) off.
DEFAULTS: Mapping[str, Features] = {
    "1.37": Features(),
    "1.35": Features(consumable_capacity=False, binding_conditions=False, device_taints=False,
                     partitionable_devices=False),
}


@dataclass(frozen=True, slots=True)
class Release:
    """How one release's allocator differs beyond its gates (read from dynamic-resource-allocation
    structured/internal at that version); explain replays the one of ``--kubernetes-version``."""

    #: A config that ends up naming every request has ``requests`` cleared (empty means all);
    #: 1.35 keeps the names.
    clears_config_for_all: bool = True
    #: A claim config naming several of the chosen requests is copied once; 1.35 copies it once
    #: per request (or chosen subrequest) it names, in request order.
    claim_config_once: bool = True
    #: After a device of an ``All`` subrequest the search stays on that subrequest; 1.35 goes on
    #: with subrequest 0 of the request (it drops the subrequest index), so an ``All`` that is not
    #: the first alternative continues as the first one (one device when that asks for one).
    all_keeps_subrequest: bool = True


RELEASES: Mapping[str, Release] = {
    "1.37": Release(),
    "1.35": Release(clears_config_for_all=False, claim_config_once=False,
                    all_keeps_subrequest=False),
}


#: Per release, the allocator implementations (structured/internal/<channel>) in the order
#: NewAllocator tries them, each with the Features fields it supports: the first that supports
#: every enabled one runs. Which one runs decides what some fields do with their gate off.
_CHANNELS: Mapping[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "1.37": (
        ("stable", frozenset({"admin_access", "prioritized_list", "partitionable_devices",
                              "device_taints"})),
        ("incubating", frozenset({"admin_access", "prioritized_list", "partitionable_devices",
                                  "device_taints", "binding_and_status", "consumable_capacity",
                                  "fractional_capacity_range"})),
    ),
    "1.35": (
        ("stable", frozenset()),
        ("incubating", frozenset({"admin_access", "prioritized_list", "partitionable_devices",
                                  "device_taints"})),
    ),
}


def channel(features: Features, version: str = MODELLED_KUBERNETES) -> str:
    """The allocator implementation kube-scheduler ``version`` runs with these gates."""
    enabled = {name for name in ("admin_access", "prioritized_list", "partitionable_devices",
                                 "device_taints", "binding_and_status", "consumable_capacity",
                                 "fractional_capacity_range", "list_type_attributes")
               if getattr(features, name)}
    for name, supported in _CHANNELS.get(version, ()):
        if enabled <= supported:
            return name
    return "experimental"


def distinct_supported(features: Features, version: str = MODELLED_KUBERNETES) -> bool:
    """distinctAttribute is code of the newer allocators (1.37: incubating on, 1.35:
    experimental), not of a gate: the older ones call it an empty constraint."""
    return channel(features, version) in (("incubating", "experimental") if version == "1.37"
                                          else ("experimental",))


def capacity_requests_refused(features: Features, version: str = MODELLED_KUBERNETES) -> bool:
    """With DRAConsumableCapacity off, 1.37's incubating and experimental allocators refuse a
    request with capacity; 1.37's stable one and all of 1.35's ignore the capacity."""
    return version == "1.37" and channel(features, version) != "stable"


def release(version: str = MODELLED_KUBERNETES) -> Release:
    found = RELEASES.get(version)
    if found is None:
        raise InputError("--kubernetes-version",
                         f"{version!r} is not modelled (choose {', '.join(sorted(RELEASES))})")
    return found


def resolve(gates: Features | Mapping[str, bool] | str | None,
            version: str = MODELLED_KUBERNETES) -> Features:
    """Features from what a caller has: a Features, ``{"DRAListTypeAttributes": True}``, the
    ``--feature-gates`` text, or None (``version``'s defaults)."""
    if isinstance(gates, Features):
        return gates
    if gates is None:
        return parse_gates("", version)
    if isinstance(gates, str):
        return parse_gates(gates, version)
    return parse_gates(",".join(f"{k}={str(bool(v)).lower()}" for k, v in gates.items()),
                       version)


def parse_gates(text: str, version: str = MODELLED_KUBERNETES) -> Features:
    """``Name=true,Name2=false`` on top of ``version``'s defaults; InputError for anything else.

    Gates the allocator does not read (DynamicResourceAllocation, DRAExtendedResource, ...) are
    accepted and ignored, as kube-scheduler takes any known gate; an unknown name is refused.
    """
    base = DEFAULTS.get(version)
    if base is None:
        raise InputError("--kubernetes-version",
                         f"{version!r} is not modelled (choose {', '.join(sorted(DEFAULTS))})")
    changes: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, raw = part.partition("=")
        name = name.strip()
        value = raw.strip().lower()
        if not sep or value not in ("true", "false"):
            raise InputError("--feature-gates", f"{part!r}: expected Name=true or Name=false")
        if not name.startswith("DRA") and name != "DynamicResourceAllocation":
            raise InputError("--feature-gates", f"{name}: not a DRA feature gate")
        on = value == "true"
        attr = GATES.get(name)
        if attr is None:
            if name == "DynamicResourceAllocation" and not on:
                raise InputError("--feature-gates", "DynamicResourceAllocation=false: the "
                                 "scheduler would not allocate devices at all")
            continue
        if name in _LOCKED[version] and on != getattr(base, attr):
            raise InputError("--feature-gates", f"{name} is locked to "
                             f"{str(getattr(base, attr)).lower()} in Kubernetes {version}")
        changes[attr] = on
    return replace(base, **changes)
