"""Kubernetes resource.Quantity parsing, for semantic comparison and local validation.

The API server returns quantities in canonical form ("1024Mi" comes back as "1Gi", "1000m" as
"1"), so comparing the strings would see a change on every sync and update forever. Values are
parsed to exact fractions instead.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity such as ``80Gi``, ``1500m`` or ``1e3``."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])
    return number * Fraction(10) ** exponent


def is_quantity(value: object) -> bool:
    try:
        parse_quantity(value)  # type: ignore[arg-type]
    except (QuantityError, TypeError):
        return False
    return True
