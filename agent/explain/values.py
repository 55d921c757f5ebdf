"""Kubernetes quantities and semantic versions, as the DRA CEL libraries and the allocator see them.

Quantities are exact ``Fraction`` values so "1Gi" and "1024Mi" compare equal and counters never
drift through float rounding. Versions follow semver 2.0.0 precedence (build metadata ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from agent.common import quantity


class ValueParseError(ValueError):
    """A quantity or version string that does not follow the Kubernetes grammar."""


def parse_quantity(text: object) -> Fraction:
    """Parse a resource.Quantity ("80Gi", "1.5", "500m", "1e3", or a plain number)."""
    try:
        return quantity.parse_quantity(text)
    except quantity.QuantityError as err:
        raise ValueParseError(str(err)) from None


format_quantity = quantity.format_quantity


_SEMVER_RE = re.compile(
    r"(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)"
    r"(?:-(?P<pre>(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
    r"(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?",
    re.ASCII,  # matched whole (fullmatch) and \d ASCII only, as Go's semver reads it
)


@dataclass(frozen=True, slots=True, order=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(self.pre) if self.pre else "")

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver 2.0.0 precedence."""
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:  # a release ranks above its pre-releases
            return 1
        if not other.pre:
            return -1
        for x, y in zip(self.pre, other.pre, strict=False):
            if x == y:
                continue
            xn, yn = x.isdigit(), y.isdigit()
            if xn and yn:
                return -1 if int(x) < int(y) else 1
            if xn != yn:  # numeric identifiers rank below alphanumeric ones
                return -1 if xn else 1
            return -1 if x < y else 1
        return -1 if len(self.pre) < len(other.pre) else 1


def parse_semver(text: object, normalize: bool = False) -> Semver:
    """Parse a semver 2.0.0 string; ``normalize`` accepts "v1.2" and leading zeros like the
    Kubernetes CEL ``semver(s, true)`` overload."""
    if not isinstance(text, str):
        raise ValueParseError(f"version must be a string, not {text!r}")
    return _parse_semver_text(text, normalize)


@lru_cache(maxsize=4096)
def _parse_semver_text(text: str, normalize: bool) -> Semver:
    s = text
    if normalize:
        s = s.removeprefix("v")
        core, sep, rest = s.partition("-") if "-" in s else s.partition("+")
        parts = core.split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
            s = ".".join(parts) + (sep + rest if sep else "")
    m = _SEMVER_RE.fullmatch(s)
    if not m:
        raise ValueParseError(f"{text!r} is not a semantic version (e.g. 1.2.3)")
    pre = tuple(m["pre"].split(".")) if m["pre"] else ()
    return Semver(int(m["major"]), int(m["minor"]), int(m["patch"]), pre)
