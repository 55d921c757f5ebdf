"""The checkpoint: what this node has prepared, per claim UID, durable across restarts.

File format (JSON, one object)::

    {
      "schemaVersion": 1,
      "claims": {"<claim uid>": {<record>}, ...},
      "checksum": "sha256:<hex>"
    }

Decisions, each answering a bug an existing driver shipped:

* **Checksum over the raw document.** The checksum is the SHA-256 of the canonical JSON
  (sorted keys, no whitespace) of the whole document *as read*, minus the ``checksum`` key.
  A reader never recomputes it from its own typed model, so fields added by a newer version
  (or unknown to this one) never break it: they are part of what was hashed and part of what
  is hashed again on rewrite, because unknown fields are kept.
* **Unknown fields preserved.** Every record and device keeps the keys this version does not
  know in ``extra`` and writes them back unchanged; top-level unknown keys are kept too.
* **Versions are additive.** A newer ``schemaVersion`` may only add optional fields; such a
  file is read, and rewritten with its own (higher) version number and all its fields. An
  incompatible format would use a different file name, so an old agent never misreads it.
* **Two-phase records** (``PrepareStarted`` then ``PrepareCompleted``) and the boot ID under
  which each record's CDI spec was written, so a reboot (tmpfs CDI dir) is told from a restart.
* **Host side effects are named before they happen.** A device's ``migPartition`` (parent
  UUID, GI profile, placement; then GI/CI ids and MIG UUID, ``agent.prepare.partitions``) is
  durable before the instance is created; ``vfRestoreDriver`` is the driver a VF goes back to
  and ``vfMacReset`` the PF and index whose MAC unprepare unsets (``agent.prepare.vfs``).
  They ride in the device's extra fields, so older readers keep them.
* **Whatever cannot be trusted is corruption.** Too deep to parse, not UTF-8, a lone UTF-16
  surrogate (``\\ud800`` parses, but can never be written back), a claim UID or name that the
  kubelet-facing path would refuse (a NUL in a UID would otherwise reach a path at start-up):
  each is a ``CheckpointCorruptError``, never another exception that stops the agent.

File I/O, locking and corruption handling live in ``agent.checkpoint.store``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from agent.claim.model import name_problem, uid_problem
from agent.common.k8snames import dns_label_problem
from agent.common.quantity import is_quantity

SCHEMA_VERSION = 1


class CheckpointCorruptError(Exception):
    """The checkpoint file cannot be trusted (unparsable, bad checksum, wrong shape)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


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
    #: The GPU time-slice interval this share asked for (``agent.prepare.enforce``).
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
        obj = _mapping(data, "device")
        known = {
            "pool", "device", "requests", "cdiDeviceIDs", "shareID", "adminAccess", "uuid",
            "ifName", "pciAddress", "consumedCapacity", "timeSlice",
        }
        return cls(
            pool=_str(obj, "pool"),
            device=_str(obj, "device"),
            requests=_str_tuple(obj, "requests"),
            cdi_ids=_str_tuple(obj, "cdiDeviceIDs"),
            share_id=_opt_str(obj, "shareID"),
            admin_access=_bool(obj, "adminAccess"),
            uuid=_opt_str(obj, "uuid"),
            if_name=_opt_str(obj, "ifName"),
            pci_address=_opt_str(obj, "pciAddress"),
            consumed=_quantities(obj, "consumedCapacity"),
            time_slice=_opt_str(obj, "timeSlice"),
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
        obj = _mapping(data, f"claim {uid} deviceMetadata")
        requests = _str_tuple(obj, "requests")
        pod_claim_name = _opt_str(obj, "podClaimName")
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
        return out

    @classmethod
    def from_json(cls, uid: str, data: Any) -> ClaimRecord:
        obj = _mapping(data, f"claim {uid}")
        known = {
            "uid", "namespace", "name", "state", "devices", "cdiAnnotations", "specPath",
            "bootID", "updated", "recovered", "allocation", "deviceMetadata",
        }
        state_text = _str(obj, "state")
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
        annotations = _mapping(obj.get("cdiAnnotations", {}), f"claim {uid} cdiAnnotations")
        allocation = obj.get("allocation")
        if allocation is not None:
            allocation = _mapping(allocation, f"claim {uid} allocation")
        namespace, name = _str(obj, "namespace"), _str(obj, "name")
        recovered = _bool(obj, "recovered")
        # A record adopted from a CDI spec (recovered) knows no namespace or name; any other
        # must name a claim the kubelet could have sent, as ``check_uid`` demands of requests.
        if not (recovered and namespace == name == "") and (
            why := name_problem(namespace, name)
        ) is not None:
            raise ValueError(f"claim {uid}: {why}")
        spec_path = _opt_str(obj, "specPath") or ""
        if "\0" in spec_path:
            raise ValueError(f"claim {uid}: specPath holds a NUL byte")
        return cls(
            uid=uid,
            namespace=namespace,
            name=name,
            state=state,
            devices=tuple(PreparedDevice.from_json(d) for d in devices),
            cdi_annotations={str(k): str(v) for k, v in annotations.items()},
            spec_path=spec_path,
            boot_id=_opt_str(obj, "bootID") or "",
            updated=_opt_str(obj, "updated") or "",
            recovered=recovered,
            allocation=allocation,
            metadata=None if obj.get("deviceMetadata") is None
            else MetadataRecord.from_json(obj["deviceMetadata"], uid),
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


def checksum(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``document`` without its ``checksum`` key."""
    body = {k: v for k, v in document.items() if k != "checksum"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def encode(data: CheckpointData) -> bytes:
    """The file's bytes. Raises ``UnicodeEncodeError`` for a string that is not valid Unicode
    (a lone surrogate) and ``ValueError``/``TypeError`` for a value JSON cannot hold."""
    doc: dict[str, Any] = dict(data.extra)
    doc["schemaVersion"] = max(data.schema_version, SCHEMA_VERSION)
    doc["claims"] = {uid: data.claims[uid].to_json() for uid in sorted(data.claims)}
    doc["checksum"] = checksum(doc)
    # Compact on purpose: ``indent`` makes the json module fall back to its pure-Python encoder,
    # which was a tenth of a prepare's time and grows with every prepared claim. Operators read
    # the file through ``dra-agent claims``.
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode(raw: bytes, path: str = "checkpoint") -> CheckpointData:
    """Parse and verify a checkpoint; anything untrustworthy raises CheckpointCorruptError."""
    doc = _loads(raw, path)
    if not isinstance(doc, dict):
        raise CheckpointCorruptError(path, "top level is not an object")
    stored = doc.get("checksum")
    try:
        # Hashing encodes every string of the document: a lone surrogate fails here, once.
        expected = checksum(doc)
    except (UnicodeEncodeError, RecursionError) as err:
        raise CheckpointCorruptError(path, f"cannot be written back: {_short(err)}") from err
    if stored != expected:
        raise CheckpointCorruptError(path, f"checksum mismatch (stored {stored!a})")
    version = doc.get("schemaVersion")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointCorruptError(path, f"bad schemaVersion {version!r}")
    claims = doc.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointCorruptError(path, "claims is not an object")
    try:
        records = {str(uid): ClaimRecord.from_json(str(uid), rec) for uid, rec in claims.items()}
    except ValueError as err:
        raise CheckpointCorruptError(path, str(err)) from err
    extra = {k: v for k, v in doc.items() if k not in ("schemaVersion", "claims", "checksum")}
    return CheckpointData(claims=records, schema_version=version, extra=extra)


def salvage(raw: bytes) -> dict[str, ClaimRecord]:
    """Best effort: the records of a corrupt file that still parse on their own.

    Used only to keep devices of surviving records marked as taken; a salvaged record is never
    trusted as proof that a claim is prepared (its spec is rewritten on the next prepare).
    """
    try:
        doc = _loads(raw, "checkpoint")
    except CheckpointCorruptError:
        return {}
    claims = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(claims, dict):
        return {}
    out: dict[str, ClaimRecord] = {}
    for uid, rec in claims.items():
        try:
            record = replace(ClaimRecord.from_json(str(uid), rec), recovered=True)
            # Kept only if it can be written back: one bad string must not make every later
            # write of the checkpoint fail.
            json.dumps(record.to_json(), ensure_ascii=False).encode()
        except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
            continue
        out[str(uid)] = record
    return out


def _loads(raw: bytes, path: str) -> Any:
    """JSON from bytes; everything the parser can raise on hostile input is corruption."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorruptError(path, f"not JSON: {_short(err)}") from err
    except RecursionError as err:  # e.g. 200,000 nested arrays
        raise CheckpointCorruptError(path, "nested too deeply to parse") from err


def _short(err: Exception) -> str:
    """An error's text, safe for a one-line log: ASCII only, at most 200 characters."""
    return ascii(str(err))[1:-1][:200]


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    """A JSON boolean, absent meaning false. Anything else is corruption: ``bool("false")``
    is True, and a record that claims admin access it never had could take a held device."""
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ValueError(f"field {key!r}: expected a string, got {value!r}")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"field {key!r}: expected a string, got {value!r}")
    return value


def _quantities(obj: Mapping[str, Any], key: str) -> dict[str, str]:
    """A map of capacity names to quantity strings; anything else is corruption (a sum
    over garbage could let a share through that does not fit)."""
    value = obj.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and is_quantity(v) for k, v in value.items()
    ):
        raise ValueError(f"field {key!r}: expected an object of quantities")
    return dict(value)


def _str_tuple(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"field {key!r}: expected a list of strings")
    return tuple(value)
