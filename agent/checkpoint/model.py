"""The checkpoint's records: what this node has prepared, per claim UID, durable across restarts.

Each record type reads and writes its own JSON (``to_json``/``from_json``, refusing a wrong
value with a ``ValueError`` that names it); the file around the records (schema version,
checksum, corruption) is ``agent.checkpoint.codec``, the readers of single typed fields are
``agent.checkpoint.fields``, and file I/O and locking are ``agent.checkpoint.store``.

Decisions, each answering a bug an existing driver shipped:

* **Unknown fields preserved.** Every record and device keeps the keys this version does not
  know in ``extra`` and writes them back unchanged; top-level unknown keys are kept too.
* **Two-phase records** (``PrepareStarted`` then ``PrepareCompleted``) and the boot ID under
  which each record's CDI spec was written, so a reboot (tmpfs CDI dir) is told from a restart.
* **Host side effects are named before they happen.** A device's ``migPartition`` (parent
  UUID, GI profile, placement; then GI/CI ids and MIG UUID, ``agent.prepare.effects.mig``) is
  durable before the instance is created; ``vfRestoreDriver`` is the driver a VF goes back to
  and ``vfMacReset`` the PF and index whose MAC unprepare unsets (``agent.prepare.effects.vfs``).
  They ride in the device's extra fields, so older readers keep them.
* **A record the kubelet-facing path would refuse is refused here.** A claim UID or name that
  no request could carry (a NUL in a UID would otherwise reach a path at start-up), a
  ``specPath`` with a NUL, metadata names that are not DNS labels. The file is then corrupt,
  and the refused record is kept as *unreadable* (``agent.checkpoint.unreadable``): never
  dropped, since that would free its devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from agent.checkpoint.fields import (
    read_bool,
    read_mapping,
    read_opt_str,
    read_quantities,
    read_str,
    read_str_tuple,
)
from agent.claim.identity import name_problem, uid_problem
from agent.common.k8snames import dns_label_problem

SCHEMA_VERSION = 1


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a claim as it was prepared (the answer to the kubelet)."""

    pool: str
    device: str
    requests: tuple[str, ...]  # base request names (subrequests stripped)
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None
    admin_access: bool = False
    #: The hardware's identity when it was prepared (GPU/MIG UUID, host interface name, PCI
    #: address), kept so metrics and ``dra-agent claims -o wide`` can name it after the device
    #: is gone or without discovery. None in records written before it was kept, or unknown.
    uuid: str | None = None
    if_name: str | None = None
    pci_address: str | None = None
    #: A share's consumedCapacity (name -> quantity): what it holds of the device, summed
    #: against the device's capacity when another share is prepared.
    consumed: Mapping[str, str] = field(default_factory=dict)
    #: The GPU time-slice interval this share asked for (``agent.prepare.effects.timeslice``).
    time_slice: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out.update(
            {
                "pool": self.pool,
                "device": self.device,
                "requests": list(self.requests),
                "cdiDeviceIDs": list(self.cdi_ids),
            }
        )
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.admin_access:
            out["adminAccess"] = True
        if self.consumed:
            out["consumedCapacity"] = dict(self.consumed)
        if self.time_slice is not None:
            out["timeSlice"] = self.time_slice
        # Written only when known: a record without them reads back as it was.
        for key, value in (("uuid", self.uuid), ("ifName", self.if_name),
                           ("pciAddress", self.pci_address)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> PreparedDevice:
        obj = read_mapping(data, "device")
        known = {
            "pool", "device", "requests", "cdiDeviceIDs", "shareID", "adminAccess", "uuid",
            "ifName", "pciAddress", "consumedCapacity", "timeSlice",
        }
        return cls(
            pool=read_str(obj, "pool"),
            device=read_str(obj, "device"),
            requests=read_str_tuple(obj, "requests"),
            cdi_ids=read_str_tuple(obj, "cdiDeviceIDs"),
            share_id=read_opt_str(obj, "shareID"),
            admin_access=read_bool(obj, "adminAccess"),
            uuid=read_opt_str(obj, "uuid"),
            if_name=read_opt_str(obj, "ifName"),
            pci_address=read_opt_str(obj, "pciAddress"),
            consumed=read_quantities(obj, "consumedCapacity"),
            time_slice=read_opt_str(obj, "timeSlice"),
            extra={k: v for k, v in obj.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class MetadataRecord:
    """The device metadata files written for a claim (``agent.prepare.metadata``).

    Only names are kept, never paths: the files' paths follow from the claim's namespace and
    name and these base request names, inside the plugin directory, so an edited checkpoint
    cannot point a removal anywhere else. ``pod_claim_name`` (the claim's
    ``resource.kubernetes.io/pod-claim-name`` annotation) is kept because the container path
    depends on it and a rebuild after a reboot has no API object to read it from.
    """

    requests: tuple[str, ...]
    pod_claim_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": list(self.requests)}
        if self.pod_claim_name is not None:
            out["podClaimName"] = self.pod_claim_name
        return out

    @classmethod
    def from_json(cls, data: Any, uid: str) -> MetadataRecord:
        obj = read_mapping(data, f"claim {uid} deviceMetadata")
        requests = read_str_tuple(obj, "requests")
        pod_claim_name = read_opt_str(obj, "podClaimName")
        for name in (*requests, *([pod_claim_name] if pod_claim_name else [])):
            if (why := dns_label_problem(name)) is not None:
                raise ValueError(f"claim {uid}: deviceMetadata name {name!a} {why}")
        return cls(requests=requests, pod_claim_name=pod_claim_name)


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """What was done for one claim; the key the kubelet uses is ``uid``."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    #: ``cdi.k8s.io/<key>`` -> comma-joined CDI IDs, as the kubelet's ContainerInfo once carried.
    cdi_annotations: Mapping[str, str] = field(default_factory=dict)
    spec_path: str = ""
    boot_id: str = ""
    #: RFC 3339 time of the last state change, for operators (``dra-agent claims``).
    updated: str = ""
    #: Rebuilt from a corrupt checkpoint or an adopted CDI spec: its devices count as taken, but
    #: the next prepare redoes the claim from the API object instead of trusting this record.
    recovered: bool = False
    #: This driver's part of the claim's ``status.allocation.devices`` (results and opaque
    #: configs, API form) when it was prepared: enough to rewrite a lost CDI spec without the
    #: API server. None in records written before it was kept.
    allocation: Mapping[str, Any] | None = None
    #: Device metadata files written for the claim; None when none were (the feature off, or
    #: a record written before it existed: such a claim is rebuilt without them).
    metadata: MetadataRecord | None = None
    #: Why this record could not be read when it was found (``agent.checkpoint.unreadable``):
    #: it is kept, always ``recovered``, for the devices it names alone. None for every other.
    unreadable: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def completed(self) -> bool:
        return self.state is ClaimState.PREPARE_COMPLETED

    def with_state(self, state: ClaimState, updated: str) -> ClaimRecord:
        return replace(self, state=state, updated=updated)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out.update(
            {
                "uid": self.uid,
                "namespace": self.namespace,
                "name": self.name,
                "state": str(self.state),
                "devices": [d.to_json() for d in self.devices],
                "cdiAnnotations": dict(self.cdi_annotations),
                "specPath": self.spec_path,
                "bootID": self.boot_id,
                "updated": self.updated,
            }
        )
        if self.recovered:
            out["recovered"] = True
        if self.allocation is not None:
            out["allocation"] = dict(self.allocation)
        if self.metadata is not None:
            out["deviceMetadata"] = self.metadata.to_json()
        if self.unreadable is not None:
            out["unreadable"] = self.unreadable
        return out

    @classmethod
    def from_json(cls, uid: str, data: Any) -> ClaimRecord:
        obj = read_mapping(data, f"claim {uid}")
        known = {
            "uid", "namespace", "name", "state", "devices", "cdiAnnotations", "specPath",
            "bootID", "updated", "recovered", "allocation", "deviceMetadata", "unreadable",
        }
        state_text = read_str(obj, "state")
        try:
            state = ClaimState(state_text)
        except ValueError as err:
            raise ValueError(f"claim {uid}: unknown state {state_text!r}") from err
        if (why := uid_problem(uid)) is not None:
            raise ValueError(f"claim {uid!a}: {why}")
        if obj.get("uid", uid) != uid:
            raise ValueError(f"claim {uid}: record carries uid {obj.get('uid')!r}")
        devices = obj.get("devices", [])
        if not isinstance(devices, list):
            raise ValueError(f"claim {uid}: devices must be a list")
        annotations = read_mapping(obj.get("cdiAnnotations", {}), f"claim {uid} cdiAnnotations")
        allocation = obj.get("allocation")
        if allocation is not None:
            allocation = read_mapping(allocation, f"claim {uid} allocation")
        namespace, name = read_str(obj, "namespace"), read_str(obj, "name")
        recovered = read_bool(obj, "recovered")
        # A record adopted from a CDI spec (recovered) knows no namespace or name; any other
        # must name a claim the kubelet could have sent, as ``check_uid`` demands of requests.
        if not (recovered and namespace == name == "") and (
            why := name_problem(namespace, name)
        ) is not None:
            raise ValueError(f"claim {uid}: {why}")
        spec_path = read_opt_str(obj, "specPath") or ""
        if "\0" in spec_path:
            raise ValueError(f"claim {uid}: specPath holds a NUL byte")
        unreadable = read_opt_str(obj, "unreadable")
        if unreadable is not None and not recovered:
            raise ValueError(f"claim {uid}: an unreadable record is always recovered")
        return cls(
            uid=uid,
            namespace=namespace,
            name=name,
            state=state,
            devices=tuple(PreparedDevice.from_json(d) for d in devices),
            cdi_annotations={str(k): str(v) for k, v in annotations.items()},
            spec_path=spec_path,
            boot_id=read_opt_str(obj, "bootID") or "",
            updated=read_opt_str(obj, "updated") or "",
            recovered=recovered,
            allocation=allocation,
            metadata=None if obj.get("deviceMetadata") is None
            else MetadataRecord.from_json(obj["deviceMetadata"], uid),
            unreadable=unreadable,
            extra={k: v for k, v in obj.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class CheckpointData:
    """The decoded file: records by claim UID plus whatever this version does not know."""

    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_claims(self, claims: Mapping[str, ClaimRecord]) -> CheckpointData:
        return replace(self, claims=claims)


def holders(
    claims: Mapping[str, ClaimRecord], pool: str, device: str, *, besides: str
) -> Iterator[tuple[ClaimRecord, PreparedDevice]]:
    """Each prepared entry of ``pool/device`` in the records of claims other than the UID
    ``besides``, with its record: what every check of a device against the other claims
    (taken, shares' capacity, one time slice per GPU) walks."""
    for record in claims.values():
        if record.uid == besides:
            continue
        for held in record.devices:
            if (held.pool, held.device) == (pool, device):
                yield record, held

