"""One simulated fault request: its fields, its JSON line and the parsing that refuses bad ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from agent.common.k8snames import dns_label_problem

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_XID",
    "FaultKind",
    "FaultRequest",
    "FaultRequestError",
    "parse_request",
    "printable",
]

#: A request is a line of JSON; anything bigger is not one.
MAX_REQUEST_BYTES = 4096
#: NVML reports an Xid as an unsigned number; real ones are below 200.
MAX_XID = 0xFFFF_FFFF
_KEYS = frozenset({"device", "fault", "xid"})


class FaultKind(StrEnum):
    XID = "xid"
    ECC = "ecc"
    LOST = "lost"
    RECOVER = "recover"


class FaultRequestError(ValueError):
    """A request that cannot be delivered; the message says why, for the log and the writer."""


def printable(text: str, limit: int = 120) -> str:
    """``text`` safe on one log or terminal line: non-printable characters (newline, escape,
    an undecodable byte of a file name) become ``?``, cut to ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _shown(value: object) -> str:
    return printable(json.dumps(value) if not isinstance(value, str) else repr(value), 60)


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """One fault for one published device."""

    device: str
    fault: FaultKind
    xid: int | None = None

    def __post_init__(self) -> None:
        problem = dns_label_problem(self.device)
        if problem is not None:
            raise FaultRequestError(f"device {_shown(self.device)}: {problem}")
        if self.fault is FaultKind.XID:
            if isinstance(self.xid, bool) or not isinstance(self.xid, int) \
                    or not 1 <= self.xid <= MAX_XID:
                raise FaultRequestError(
                    f"xid must be a number from 1 to {MAX_XID}, not {_shown(self.xid)}")
        elif self.xid is not None:
            raise FaultRequestError(f"xid is only for the fault xid, not {self.fault}")

    def to_json(self) -> bytes:
        doc: dict[str, object] = {"device": self.device, "fault": str(self.fault)}
        if self.xid is not None:
            doc["xid"] = self.xid
        return (json.dumps(doc) + "\n").encode()

    def describe(self) -> str:
        """``Xid 79``, ``double-bit ECC error``, ``lost``, ``recover``."""
        if self.fault is FaultKind.XID:
            return f"Xid {self.xid}"
        if self.fault is FaultKind.ECC:
            return "double-bit ECC error"
        return str(self.fault)


def parse_request(raw: bytes) -> FaultRequest:
    """The request in a file's bytes; ``FaultRequestError`` says what is wrong with them."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FaultRequestError(f"not UTF-8 text (byte at offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise FaultRequestError(f"not JSON: {err.msg} at line {err.lineno} column {err.colno}") \
            from None
    except RecursionError:
        raise FaultRequestError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise FaultRequestError(
            'not a JSON object like {"device": "gpu-3", "fault": "xid", "xid": 79}')
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise FaultRequestError(f"unknown key(s) {', '.join(_shown(k) for k in unknown[:5])}; "
                                f"known: {', '.join(sorted(_KEYS))}")
    device, fault = doc.get("device"), doc.get("fault")
    if not isinstance(device, str):
        raise FaultRequestError(f"device must be a device name like \"gpu-3\", not "
                                f"{_shown(device)}")
    if not isinstance(fault, str) or fault not in set(FaultKind):
        raise FaultRequestError(f"fault {_shown(fault)} is not one of "
                                f"{', '.join(k.value for k in FaultKind)}")
    return FaultRequest(device, FaultKind(fault), doc.get("xid"))
