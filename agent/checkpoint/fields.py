"""The typed readers of single JSON fields of a checkpoint record: each returns the value in
the type the record holds, or raises a ``ValueError`` that names the field. A value of any
other type is corruption, never coerced: a record must read back as exactly what was written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.common.quantity import is_quantity


def read_bool(obj: Mapping[str, Any], key: str) -> bool:
    """A JSON boolean, absent meaning false. Anything else is corruption: ``bool("false")``
    is True, and a record that claims admin access it never had could take a held device."""
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def read_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def read_str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ValueError(f"field {key!r}: expected a string, got {value!r}")
    return value


def read_opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"field {key!r}: expected a string, got {value!r}")
    return value


def read_quantities(obj: Mapping[str, Any], key: str) -> dict[str, str]:
    """A map of capacity names to quantity strings; anything else is corruption (a sum
    over garbage could let a share through that does not fit)."""
    value = obj.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and is_quantity(v) for k, v in value.items()
    ):
        raise ValueError(f"field {key!r}: expected an object of quantities")
    return dict(value)


def read_str_tuple(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"field {key!r}: expected a list of strings")
    return tuple(value)
