"""Kubernetes ``resource.Quantity`` values as exact fractions.

One parser for the whole agent: the slice controller compares what the API server returned
(it canonicalises "1024Mi" to "1Gi", so string comparison would update forever) and explain
compares capacities and counters (floats would drift). ``format_quantity`` gives the shortest
canonical spelling back.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity."""


_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)


def parse_quantity(text: object) -> Fraction:
    """Parse a resource.Quantity ("80Gi", "1.5", "500m", "1e3", or a plain number)."""
    if isinstance(text, bool):
        raise QuantityError(f"quantity must be a string or number, not {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string or number, not {text!r}")
    return _parse_quantity_text(text)


# Pure functions memoised: a node's slices repeat the same few spellings thousands of times.
@lru_cache(maxsize=4096)
def _parse_quantity_text(text: str) -> Fraction:
    m = _QUANTITY_RE.match(text.strip())
    if not m or not text.strip():
        raise QuantityError(f"{text!r} is not a quantity (e.g. 80Gi, 500m, 2)")
    number = Fraction(str(m["num"]))
    if m["bin"]:
        return number * int(1024 ** _BINARY[m["bin"]])
    if m["exp"]:
        return number * Fraction(10) ** int(m["exp"][1:])
    return number * Fraction(10) ** _DECIMAL[m["dec"] or ""]


def format_quantity(value: Fraction) -> str:
    """The shortest spelling with a binary or decimal suffix ("80Gi", "40G", "500m")."""
    if value.denominator == 1:
        n = value.numerator
        spellings = [str(n)]
        if n != 0:
            for suffix, power in _BINARY.items():
                if n % int(1024**power) == 0:
                    spellings.append(f"{n // int(1024**power)}{suffix}")
            for suffix, exp in _DECIMAL.items():
                if exp > 0 and n % int(10**exp) == 0:
                    spellings.append(f"{n // int(10**exp)}{suffix}")
        # The shortest spelling: "1Ki" rather than "1024", "40G" rather than "39062500Ki".
        return min(reversed(spellings), key=len)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    nano = value * 10**9
    return f"{round(nano)}n"


def is_quantity(value: object) -> bool:
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True
