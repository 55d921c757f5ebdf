"""Label and field selectors with the real server's grammar, limits and 400 messages."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import APIError, bad_request
from .resources import ResourceType
from .validation_names import is_label_value, is_qualified_name

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # = != in notin exists !exists gt lt
    values: tuple[str, ...]

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!exists":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if not has:
            return False
        try:
            number = int(value or "")
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (set values contain commas)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


_SET = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP = re.compile(r"^([^=!<>\s]+)\s*(==|!=|=|>|<)\s*(.*?)\s*$")


def _parse_error(text: str, why: str) -> APIError:
    return bad_request(f'unable to parse requirement: {why}: "{text}"')


def _check_key(key: str, text: str) -> None:
    if not is_qualified_name(key):
        raise _parse_error(text, f"invalid label key {key!r}")


def _check_value(value: str, text: str) -> None:
    if not is_label_value(value):
        raise _parse_error(text, f"invalid label value: {value!r}")


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`; empty means everything."""
    out: list[Requirement] = []
    if not text.strip():
        return out
    for raw in _split_top_level(text):
        req = raw.strip()
        if not req:
            raise bad_request(f"found '', expected: identifier in selector \"{text}\"")
        if req.startswith("!"):
            key = req[1:].strip()
            _check_key(key, req)
            out.append(Requirement(key, "!exists", ()))
            continue
        m = _SET.match(req)
        if m:
            key, op, body = m.group(1), m.group(2), m.group(3)
            _check_key(key, req)
            values = tuple(v.strip() for v in body.split(",")) if body.strip() else ()
            if not values:
                raise _parse_error(req, "for 'in', 'notin' operators, values set can't be empty")
            for v in values:
                _check_value(v, req)
            out.append(Requirement(key, op, values))
            continue
        m = _CMP.match(req)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check_key(key, req)
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise _parse_error(
                        req, f"for 'Gt', 'Lt' operators, the value must be an integer: {value}"
                    )
                out.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
                continue
            _check_value(value, req)
            out.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
            continue
        if re.fullmatch(r"\S+", req):
            _check_key(req, req)
            out.append(Requirement(req, "exists", ()))
            continue
        raise bad_request(f'couldn\'t parse the selector string "{text}"')
    return out


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    negate: bool
    value: str


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str, rtype: ResourceType, version: str) -> list[FieldRequirement]:
    """Parse `a=b,c!=d`; a label the kind does not index is a 400, as upstream conversion says."""
    out: list[FieldRequirement] = []
    if not text.strip():
        return out
    for raw in re.split(r"(?<!\\),", text):
        term = raw.strip()
        m = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)(.*)", term)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        name, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3))
        if name not in rtype.field_labels:
            if not rtype.custom_field_labels:
                raise bad_request(
                    f'"{name}" is not a known field selector: only "metadata.name", '
                    '"metadata.namespace"'
                )
            if rtype.group:
                raise bad_request(
                    f"field label not supported for {rtype.group}/{version}, "
                    f"Kind={rtype.kind}: {name}"
                )
            raise bad_request(f"field label not supported: {name}")
        out.append(FieldRequirement(name, op == "!=", value))
    return out


def field_value(obj: Obj, path: str) -> str:
    """The string the real server indexes for a field label (absent reads as empty/false)."""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if path == "spec.unschedulable":
        return "true" if cur is True else "false"
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def make_matcher(
    labels: list[Requirement], fields: list[FieldRequirement], namespace: str | None = None
) -> Callable[[Obj], bool]:
    def match(obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        obj_labels = meta.get("labels") or {}
        if not all(r.matches(obj_labels) for r in labels):
            return False
        return all((field_value(obj, f.field) == f.value) != f.negate for f in fields)

    return match
