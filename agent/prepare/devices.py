"""One device of a claim as the preparation sees it: its env, its identity in the record, and
the NIC rules that apply per device.

A NIC's host interface moves into the pod only when the claim's opaque config asks for it
(``netdev.move``); then the device must have an interface, and no two moved interfaces of one
claim may share a name in the pod (the runtime would fail the container after the claim was
reported prepared).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.checkpoint.model import PreparedDevice
from agent.claim.model import AllocatedDevice, ClaimRef
from agent.claim.opaque import DeviceConfig, SharingConfig
from agent.claim.status import NicStatus
from agent.netdev.config import InterfaceConfig
from agent.prepare.errors import BadConfigError, admin_refusal
from cdi.spec import Hook, Mount
from discovery.model import Device, DeviceType

#: Device types whose host network interface a claim may move into the pod.
NETDEV_TYPES = frozenset({DeviceType.NIC, DeviceType.VF})


@dataclass(frozen=True, slots=True)
class SpecDevice:
    """One device of a claim's CDI spec: the inventory device plus the env describing it.

    ``move_netdev``: the claim's opaque config moves the device's host interface into the pod,
    named ``interface_name`` there (None: its host name). ``mounts``: bind mounts of the
    claim's own files (its device metadata, ``agent.prepare.metadata``).
    """

    device: Device
    env: tuple[str, ...]
    move_netdev: bool = False
    interface_name: str | None = None
    mounts: tuple[Mount, ...] = ()
    #: The allocation's shareID: a share is its own CDI device (``cdispecs``).
    share_id: str | None = None
    #: A share's consumedCapacity and how the claim asks it to be bounded (``enforce``).
    consumed: Mapping[str, str] = field(default_factory=dict)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    #: ``vf.driver`` of the claim's config for a VF (``agent.prepare.effects.vfs``); None otherwise.
    vf_driver: str | None = None
    #: Allocated with admin access: no effect changes the host for it (``admin_refusal``).
    admin_access: bool = False
    #: The request the device was allocated for (error lines name it).
    request: str = ""
    #: What the moved interface gets in the pod (``agent.prepare.effects.netdev``), and the
    #: OCI hooks that effect adds to the device's edits to give it.
    netconf: InterfaceConfig | None = None
    hooks: tuple[Hook, ...] = ()

    @property
    def pod_interface(self) -> str | None:
        """The interface's name inside the pod when it moves there."""
        return (self.interface_name or self.device.host.if_name) if self.move_netdev else None


def spec_device(
    ref: ClaimRef, result: AllocatedDevice, device: Device, env: tuple[str, ...],
    config: DeviceConfig,
) -> SpecDevice:  # fmt: skip
    """The device with its netdev choice; a GPU ignores a claim-wide ``netdev``."""
    vf_driver = config.vf_driver if device.type == DeviceType.VF else None
    admin = result.admin_access
    if not (config.move_netdev and device.type in NETDEV_TYPES):
        return SpecDevice(device=device, env=env, share_id=result.share_id,
                          consumed=result.consumed_capacity, sharing=config.sharing,
                          vf_driver=vf_driver, admin_access=admin,
                          request=result.base_request)
    if admin:
        raise admin_refusal(str(ref), device.name, result.base_request,
                            "netdev.move would take its interface out of the host's "
                            "namespace (and out of its holder's pod); drop netdev.move")
    if not device.host.if_name:
        raise BadConfigError(
            str(ref),
            f"opaque config for request {result.base_request}: netdev.move: device "
            f"{device.name} has no network interface on the host (driver "
            f"{device.host.driver or 'none'}), so there is nothing to move; drop "
            "netdev.move for this request",
        )
    if result.share_id:
        raise BadConfigError(
            str(ref),
            f"opaque config for request {result.base_request}: netdev.move: device "
            f"{device.name} is shared (shareID {result.share_id}); its interface cannot move "
            "into one pod while other pods hold shares of it; drop netdev.move",
        )
    return SpecDevice(device=device, env=env, move_netdev=True,
                      interface_name=config.pod_interface_name, vf_driver=vf_driver,
                      request=result.base_request,
                      netconf=config.netdev.interface if config.netdev.interface.is_set
                      else None)  # fmt: skip


def env_key(device_name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", device_name.upper())


def device_env(result: AllocatedDevice, device: Device, config: DeviceConfig) -> tuple[str, ...]:
    """The env describing one device of a claim in its containers."""
    key = f"DRA_AGENT_DEVICE_{env_key(device.name)}"
    # The configs' env first, the agent's after it (its values win on a shared name).
    env = [f"{k}={v}" for k, v in config.env.items()]
    env += [f"{key}={result.pool}/{device.name}", f"{key}_REQUEST={result.base_request}"]
    if device.host.pci_address:
        env.append(f"{key}_PCI_ADDRESS={device.host.pci_address}")
    if result.admin_access:
        env.append(f"{key}_ADMIN_ACCESS=true")
    if result.share_id:
        env.append(f"{key}_SHARE_ID={result.share_id}")
    return tuple(env)


def check_pod_interfaces(ref: ClaimRef, devices: Sequence[SpecDevice]) -> None:
    """Refuse two interfaces moved into one pod under the same name."""
    seen: dict[str, str] = {}
    for item in devices:
        name = item.pod_interface
        if name is None:
            continue
        if name in seen:
            raise BadConfigError(
                str(ref),
                f"netdev.interfaceName: devices {seen[name]} and {item.device.name} would "
                f"both be {name!r} inside the pod; give each request its own interfaceName",
            )
        seen[name] = item.device.name


def nic_status(result: AllocatedDevice, item: SpecDevice) -> NicStatus:
    """The claim-status facts of a prepared NIC: the interface name inside the pod when it
    moved there, the host's otherwise; the MAC discovery published (``macAddress``) or the
    one the claim's config gives it, and the addresses the config gives it."""
    mac = item.device.attributes.get("macAddress")
    config = item.netconf  # what the netdev hook gives the interface in the pod
    if config is not None and config.hardware_address:
        mac = config.hardware_address
    return NicStatus(
        pool=result.pool, device=result.device, share_id=result.share_id,
        interface_name=item.pod_interface or item.device.host.if_name,
        hardware_address=mac if isinstance(mac, str) else None,
        ips=tuple(str(a) for a in config.addresses or ()) if config is not None else (),
    )  # fmt: skip


def identified(
    devices: Sequence[PreparedDevice], pool: str, inventory: dict[str, Device]
) -> tuple[PreparedDevice, ...]:
    """``devices`` carrying the identity of the hardware they are prepared on now.

    Called wherever a spec is (re)written from ``inventory``: after a reboot the device of a
    name may be another card (a swapped GPU keeps its PCI slot, so its name), and the record
    must name what the container gets. A device not in the inventory keeps what it had.
    """
    out = []
    for held in devices:
        found = inventory.get(held.device) if held.pool == pool else None
        if found is None or (held.uuid, held.if_name, held.pci_address) == (
                found.host.uuid, found.host.if_name, found.host.pci_address):
            out.append(held)  # as it is: a prepare pays for no copy of what did not change
            continue
        out.append(replace(held, uuid=found.host.uuid, if_name=found.host.if_name,
                           pci_address=found.host.pci_address))
    return tuple(out)
