"""The checkpoint file: its bytes to and from ``CheckpointData``, verified.

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
* **Versions are additive.** A newer ``schemaVersion`` may only add optional fields; such a
  file is read, and rewritten with its own (higher) version number and all its fields. An
  incompatible format would use a different file name, so an old agent never misreads it.
* **Whatever cannot be trusted is corruption.** Too deep to parse, not UTF-8, a lone UTF-16
  surrogate (``\\ud800`` parses, but can never be written back), a record its type refuses
  (``agent.checkpoint.model``): each is a ``CheckpointCorruptError``, never another exception
  that stops the agent.
* **Nothing read is dropped.** ``salvage`` keeps every record of a corrupt file, recovered; a
  record it cannot read is kept as *unreadable*, holding the devices it names
  (``agent.checkpoint.unreadable``): a dropped record would free them for another claim.

The records are ``agent.checkpoint.model``; file I/O, locking and corruption handling live in
``agent.checkpoint.store``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from agent.checkpoint.model import SCHEMA_VERSION, CheckpointData, ClaimRecord
from agent.checkpoint.unreadable import unreadable_record


class CheckpointCorruptError(Exception):
    """The checkpoint file cannot be trusted (unparsable, bad checksum, wrong shape)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


def checksum(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``document`` without its ``checksum`` key."""
    body = {k: v for k, v in document.items() if k != "checksum"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


#: uid -> (the record, its member of ``claims``): what ``encode`` may reuse. A record is
#: immutable (a frozen dataclass whose changes are new records), so a cached text stays right
#: for as long as the record it was made from is the one the checkpoint holds.
RecordTexts = dict[str, tuple[ClaimRecord, str]]


def record_member(uid: str, record: ClaimRecord) -> str:
    """``"<uid>":<record>`` in canonical JSON (sorted keys, no whitespace), as the file's
    ``claims`` object holds it."""
    return json.dumps(uid, ensure_ascii=False) + ":" + json.dumps(
        record.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode(data: CheckpointData, texts: RecordTexts | None = None) -> bytes:
    """The file's bytes. Raises ``UnicodeEncodeError`` for a string that is not valid Unicode
    (a lone surrogate) and ``ValueError``/``TypeError`` for a value JSON cannot hold.

    ``texts`` (kept by the caller between writes) holds each record's text from an earlier
    write: only records changed since are encoded again, and it is left holding the records
    written now. Encoding every record at every write made a prepare's CPU grow with the
    claims a node holds (64 claims: 2 ms of encoding per prepare+unprepare, 0.06 ms at one).
    """
    cache: RecordTexts = {} if texts is None else texts
    fresh: RecordTexts = {}
    for uid, record in data.claims.items():
        known = cache.get(uid)
        fresh[uid] = known if known is not None and known[0] is record else (
            record, record_member(uid, record))
    if texts is not None:
        texts.clear()
        texts.update(fresh)
    doc: dict[str, Any] = dict(data.extra)
    doc["schemaVersion"] = max(data.schema_version, SCHEMA_VERSION)
    doc.pop("checksum", None)
    doc.pop("claims", None)
    # One encoding of the members serves both the checksum and the file: the file is the
    # canonical text with the checksum member in its sorted place, which is what
    # ``json.dumps(doc, sort_keys=True)`` writes whenever the text is ASCII (it escapes
    # nothing then). Encoding the document twice was a tenth of a checkpoint write's CPU.
    members = {key: json.dumps(doc[key], sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False) for key in doc}
    members["claims"] = "{" + ",".join(fresh[uid][1] for uid in sorted(fresh)) + "}"
    canon = _object(members)
    digest = "sha256:" + hashlib.sha256(canon.encode()).hexdigest()
    if not canon.isascii():  # the file escapes what the canonical text keeps
        doc["claims"] = {uid: data.claims[uid].to_json() for uid in data.claims}
        doc["checksum"] = digest
        return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()
    members["checksum"] = json.dumps(digest)
    # Compact on purpose: ``indent`` makes the json module fall back to its pure-Python encoder,
    # which was a tenth of a prepare's time and grows with every prepared claim. Operators read
    # the file through ``dra-agent claims``.
    return (_object(members) + "\n").encode()


def _object(members: Mapping[str, str]) -> str:
    """A JSON object from its members' encoded values, keys sorted as ``sort_keys`` sorts."""
    return "{" + ",".join(f"{json.dumps(key, ensure_ascii=False)}:{members[key]}"
                          for key in sorted(members)) + "}"


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
    """Best effort: the records of a corrupt file, each *recovered*.

    Used only to keep the devices of those records taken; a salvaged record is never trusted
    as proof that a claim is prepared (its spec is rewritten on the next prepare), nor as
    what to change on the host. A record that does not parse on its own, or could not be
    written back, is kept as *unreadable* (``agent.checkpoint.unreadable``): the devices it
    names stay taken. So is whatever ``claims`` holds when it is not an object.
    """
    try:
        doc = _loads(raw, "checkpoint")
    except CheckpointCorruptError:
        return {}
    claims = doc.get("claims") if isinstance(doc, dict) else None
    if claims is None:
        return {}
    if not isinstance(claims, dict):
        record = unreadable_record(None, claims, "claims is not an object")
        return {record.uid: record} if record.devices else {}
    out: dict[str, ClaimRecord] = {}
    for uid, rec in claims.items():
        try:
            record = replace(ClaimRecord.from_json(str(uid), rec), recovered=True)
            # Kept as it is only if it can be written back: one bad string must not make
            # every later write of the checkpoint fail.
            json.dumps(record.to_json(), ensure_ascii=False).encode()
        except (ValueError, TypeError, RecursionError) as err:  # UnicodeEncodeError is one
            record = unreadable_record(uid, rec, str(err), taken={*claims, *out})
        out[record.uid] = record
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

