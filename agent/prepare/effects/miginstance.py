"""A MIG partition as the checkpoint records it (``PreparedDevice.extra["migPartition"]``).

Its *intent* (parent GPU, profile, placement) is written before the GPU instance is created,
its GI/CI ids and MIG UUID after; older agents carry the field through unchanged (unknown
fields are preserved). What dra-agent made is exactly what these records name
(``owned_instances``): instances no record names are someone else's, never touched, and their
placements are not published (``discovery.partitions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from discovery.model import Device
from discovery.partitions import OwnedKey, Partition

KEY = "migPartition"


@dataclass(frozen=True, slots=True)
class Instance:
    """A partition as the checkpoint records it: the intent, then what NVML made of it."""

    parent_uuid: str
    profile_id: int
    start: int
    size: int
    slices: int
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None

    @classmethod
    def of(cls, part: Partition) -> Instance:
        return cls(part.parent_uuid, part.profile_id, part.start, part.size, part.slices)

    @property
    def created(self) -> bool:
        return self.gi is not None and self.ci is not None and self.uuid is not None

    @property
    def key(self) -> OwnedKey:
        return (self.parent_uuid, self.profile_id, self.start)

    def describe(self) -> str:
        return (f"GPU instance profile {self.profile_id} at placement {self.start}:{self.size} "
                f"on {self.parent_uuid}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parentUUID": self.parent_uuid, "profileID": self.profile_id,
                               "start": self.start, "size": self.size, "slices": self.slices}
        for key, value in (("gi", self.gi), ("ci", self.ci), ("uuid", self.uuid)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Instance | None:
        """None for anything that is not a partition record as ``to_json`` writes it (never
        raises, never coerces: ``"9"`` or ``true`` is no profile id or placement)."""
        if not isinstance(data, Mapping):
            return None
        profile, start, size, slices, gi, ci = (
            _count(data.get(k)) for k in ("profileID", "start", "size", "slices", "gi", "ci"))
        parent, uuid = data.get("parentUUID"), data.get("uuid")
        if not isinstance(parent, str) or profile is None or start is None or size is None \
                or slices is None or (gi is None) != (data.get("gi") is None) \
                or (ci is None) != (data.get("ci") is None) \
                or not (uuid is None or isinstance(uuid, str)):
            return None
        return cls(parent, profile, start, size, slices, gi, ci, uuid)

    def same_partition(self, other: Instance) -> bool:
        """The same GPU, profile and placement (whatever ids either has)."""
        return (self.parent_uuid, self.profile_id, self.start, self.size, self.slices) == (
            other.parent_uuid, other.profile_id, other.start, other.size, other.slices)


def _count(value: object) -> int | None:
    """A JSON integer of at least 0, else None (a bool is no count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def instance_of(held: PreparedDevice) -> Instance | None:
    return Instance.from_json(held.extra.get(KEY)) if KEY in held.extra else None


def with_instance(held: PreparedDevice, inst: Instance) -> PreparedDevice:
    return replace(held, uuid=inst.uuid or held.uuid, extra={**held.extra, KEY: inst.to_json()})


def owned_instances(claims: Mapping[str, ClaimRecord]) -> frozenset[OwnedKey]:
    """The instances dra-agent made or is making, by (parent UUID, profile, placement)."""
    return frozenset(inst.key for r in claims.values() for d in r.devices
                     if (inst := instance_of(d)) is not None)


def mig_device(device: Device, inst: Instance) -> Device:
    """The published partition as the MIG device it now is (UUID, GI and CI ids)."""
    host = replace(device.host, uuid=inst.uuid, mig_gi=inst.gi, mig_ci=inst.ci)
    attrs = {**device.attributes, "uuid": inst.uuid or ""}
    return replace(device, attributes=attrs, host=host)


def put_instance(record: ClaimRecord, device: str, inst: Instance | None) -> ClaimRecord:
    """``record`` with ``device``'s partition set (None: removed)."""
    def change(held: PreparedDevice) -> PreparedDevice:
        if inst is not None:
            return with_instance(held, inst)
        return replace(held, extra={k: v for k, v in held.extra.items() if k != KEY})

    devices = tuple(change(d) if d.device == device else d for d in record.devices)
    return replace(record, devices=devices)
