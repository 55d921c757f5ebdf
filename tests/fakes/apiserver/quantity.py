"""resource.Quantity parsing and the canonical form the real server returns ("1024Mi" -> "1Gi")."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext

QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
QUANTITY_MSG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> tuple[Decimal, str]:
    """Value and format ("BinarySI", "DecimalSI", "DecimalExponent") of a quantity."""
    if isinstance(text, bool):
        raise QuantityError(QUANTITY_MSG)
    if isinstance(text, int | float):
        text = repr(text) if isinstance(text, float) else str(text)
    m = QUANTITY_RE.match(text.strip())
    if not m or text != text.strip():
        raise QuantityError(QUANTITY_MSG)
    number, suffix = m.group(1), m.group(2)
    if number.count(".") > 1 or number.strip("+-") in ("", "."):
        raise QuantityError(QUANTITY_MSG)
    with localcontext() as ctx:
        ctx.prec = 80
        value = Decimal(number)
        if suffix in _BINARY:
            return value * (Decimal(2) ** _BINARY[suffix]), "BinarySI"
        if suffix in _DECIMAL:
            return value.scaleb(_DECIMAL[suffix]), "DecimalSI"
        em = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
        if em:
            return value.scaleb(int(em.group(1))), "DecimalExponent"
    raise QuantityError(QUANTITY_MSG)


def _decimal_form(value: Decimal, exponent_style: bool) -> str:
    # Mantissa integral, exponent a multiple of 3, exponent as large as possible.
    if value == 0:
        return "0"
    exp = -9
    while True:
        nxt = exp + 3
        if (value.scaleb(-nxt) % 1) != 0 or nxt > 18:
            break
        exp = nxt
    mantissa = int(value.scaleb(-exp))
    if exponent_style:
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"


def canonical_quantity(text: str | int | float) -> str:
    value, fmt = parse_quantity(text)
    with localcontext() as ctx:
        ctx.prec = 80
        # The real Quantity keeps nano precision and rounds smaller amounts up.
        value = value.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
        if fmt == "BinarySI" and (abs(value) < 1024 or value % 1 != 0):
            fmt = "DecimalSI"
        if fmt == "BinarySI":
            whole = int(value)
            for suffix, bits in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
                if whole % (1 << bits) == 0:
                    return f"{whole >> bits}{suffix}"
            return str(whole)
        return _decimal_form(value, fmt == "DecimalExponent")


def quantity_value(text: str | int | float) -> Decimal:
    return parse_quantity(text)[0]
