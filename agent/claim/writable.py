"""What can be written to the checkpoint or a CDI spec: every string valid Unicode (encodable
as UTF-8, no lone surrogate) and nesting no deeper than ``MAX_DEPTH``. A claim is checked
when it is read (``agent.claim.parse``), so a bad value fails there, naming its JSON path,
and not at a durable write long after."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: How deep a claim's JSON may nest. The checkpoint keeps this driver's opaque parameters, and
#: Python's json encoder recurses: near its recursion limit (~1,000) the durable write would
#: fail long after parsing. The API server lets 10 KiB of parameters nest thousands deep; our
#: own DeviceConfig needs 3 levels, so 64 refuses nothing real.
MAX_DEPTH = 64


def unwritable_path(value: Any, path: str) -> tuple[str, str] | None:
    """The JSON path of the first part of ``value`` that cannot be written to the checkpoint
    or a CDI spec, and why: a string (key or value) that is not valid Unicode (it cannot be
    encoded as UTF-8), or nesting deeper than ``MAX_DEPTH``. None when everything can.

    Iterative, so a deeply nested opaque parameter cannot exhaust the stack; the path shows a
    key that is itself the problem escaped (ASCII), so the error line is safe to log and send.
    """
    stack: list[tuple[str, Any, int]] = [(path, value, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, str):
            if not encodes(item):
                return where, _NOT_UNICODE
            continue
        if isinstance(item, Mapping | list | tuple) and depth >= MAX_DEPTH:
            # The path of a 2,000-deep list is thousands of "[0]": its start says enough.
            shown = where if len(where) <= 120 else where[:117] + "..."
            return shown, f"nests deeper than {MAX_DEPTH} levels"
        if isinstance(item, Mapping):
            for key, child in item.items():
                shown = key if isinstance(key, str) and key.isprintable() else ascii(key)
                if isinstance(key, str) and not encodes(key):
                    return f"{where}.{shown}", _NOT_UNICODE
                stack.append((f"{where}.{shown}", child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child, depth + 1) for i, child in enumerate(item))
    return None


_NOT_UNICODE = "holds a string that is not valid Unicode (a lone UTF-16 surrogate such as \\ud800)"


def encodes(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
