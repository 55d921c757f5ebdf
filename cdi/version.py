"""The CDI versions this library knows, and how to order them.

A leaf: the spec model (``cdi.spec``) decides which version a spec needs, the parser
(``cdi.parse``) checks a file declares enough; both compare versions here.
"""

from __future__ import annotations

#: Versions this library can write or read, oldest first.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
BASELINE = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.0"`` -> ``(0, 5, 0)``; a leading ``v`` is tolerated as the Go library does."""
    return tuple(int(part) for part in version.lstrip("v").split("."))
