"""Errors the fake answers with, shaped as the real server's `Status` objects.

Every failure is raised as an `APIError` where the fact is known and turned into an HTTP answer
by the handler, so the code that decides (store, validation, patch) never writes HTTP itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Field error types, spelled as apimachinery's field.ErrorType strings and cause reasons.
_TYPES: dict[str, tuple[str, str]] = {
    "Required": ("FieldValueRequired", "Required value"),
    "Invalid": ("FieldValueInvalid", "Invalid value"),
    "TooMany": ("FieldValueTooMany", "Too many"),
    "TooLong": ("FieldValueTooLong", "Too long"),
    "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
    "Forbidden": ("FieldValueForbidden", "Forbidden"),
    "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
}

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    return _REASONS.get(code, "Unknown")


def _go_value(value: Any) -> str:
    """Render a value roughly as field.Error does: strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation failure at one field path (apimachinery's field.Error)."""

    type: str
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        word = _TYPES[self.type][1]
        if self.type in ("Required", "Forbidden"):
            return f"{word}: {self.detail}" if self.detail else word
        if self.type == "TooMany":
            return f"{word}: {self.value}: {self.detail}"
        if self.type == "TooLong":
            return f"{word}: {self.detail}"
        text = f"{word}: {_go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def cause(self) -> dict[str, Any]:
        return {"reason": _TYPES[self.type][0], "message": self.body(), "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


@dataclass
class APIError(Exception):
    """A request that fails: carries exactly what goes into the Status body."""

    code: int
    message: str
    reason: str = ""
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reason:
            self.reason = reason_for(self.code)
        Exception.__init__(self, f"{self.code} {self.reason}: {self.message}")

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    # StatusDetails.name is omitempty: ListOptions/PatchOptions errors carry no name.
    out: dict[str, Any] = {"name": name} if name else {}
    if group:
        out["group"] = group
    out["kind"] = kind
    return out


def not_found(qualified: str, group: str, plural: str, name: str) -> APIError:
    return APIError(404, f'{qualified} "{name}" not found', details=_details(name, group, plural))


def already_exists(
    qualified: str, group: str, plural: str, name: str, terminating: bool = False
) -> APIError:
    prefix = "object is being deleted: " if terminating else ""
    return APIError(
        409,
        f'{prefix}{qualified} "{name}" already exists',
        reason="AlreadyExists",
        details=_details(name, group, plural),
    )


def conflict(qualified: str, group: str, plural: str, name: str, why: str) -> APIError:
    return APIError(
        409,
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        details=_details(name, group, plural),
    )


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(group_kind: str, group: str, kind: str, name: str, errs: list[FieldError]) -> APIError:
    """422 with every error in causes; the message joins them as ToAggregate does."""
    texts = [str(e) for e in errs]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(name, group, kind)
    details["causes"] = [e.cause() for e in errs]
    return APIError(422, f'{group_kind} "{name}" is invalid: {joined}', details=details)


def bad_request(message: str) -> APIError:
    return APIError(400, message)


def expired(message: str) -> APIError:
    return APIError(410, message)


def internal(message: str) -> APIError:
    return APIError(500, message, details={"causes": [{"message": message}]})
