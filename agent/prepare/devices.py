"""One device of a claim as the preparation sees it, and the NIC rules that apply per device.

A NIC's host interface moves into the pod only when the claim's opaque config asks for it
(``netdev.move``); then the device must have an interface, and no two moved interfaces of one
claim may share a name in the pod (the runtime would fail the container after the claim was
reported prepared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.claim.model import AllocatedDevice, ClaimRef
from agent.claim.opaque import DeviceConfig
from agent.claim.status import NicStatus
from agent.prepare.errors import BadConfigError
from discovery.model import Device, DeviceType

#: Device types whose host network interface a claim may move into the pod.
NETDEV_TYPES = frozenset({DeviceType.NIC, DeviceType.VF})


@dataclass(frozen=True, slots=True)
class SpecDevice:
    """One device of a claim's CDI spec: the inventory device plus the env describing it.

    ``move_netdev``: the claim's opaque config moves the device's host interface into the pod,
    named ``interface_name`` there (None: its host name).
    """

    device: Device
    env: tuple[str, ...]
    move_netdev: bool = False
    interface_name: str | None = None

    @property
    def pod_interface(self) -> str | None:
        """The interface's name inside the pod when it moves there."""
        return (self.interface_name or self.device.host.if_name) if self.move_netdev else None


def spec_device(
    ref: ClaimRef, result: AllocatedDevice, device: Device, env: tuple[str, ...],
    config: DeviceConfig,
) -> SpecDevice:  # fmt: skip
    """The device with its netdev choice; a GPU ignores a claim-wide ``netdev``."""
    if not (config.move_netdev and device.type in NETDEV_TYPES):
        return SpecDevice(device=device, env=env)
    if not device.host.if_name:
        raise BadConfigError(
            str(ref),
            f"opaque config for request {result.base_request}: netdev.move: device "
            f"{device.name} has no network interface on the host (driver "
            f"{device.host.driver or 'none'}), so there is nothing to move; drop "
            "netdev.move for this request",
        )
    return SpecDevice(device=device, env=env, move_netdev=True,
                      interface_name=config.pod_interface_name)  # fmt: skip


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
    moved there, the host's otherwise; the MAC discovery published (``macAddress``)."""
    mac = item.device.attributes.get("macAddress")
    return NicStatus(
        pool=result.pool, device=result.device, share_id=result.share_id,
        interface_name=item.pod_interface or item.device.host.if_name,
        hardware_address=mac if isinstance(mac, str) else None,
    )  # fmt: skip
