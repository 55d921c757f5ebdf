"""Loading the CEL engine, and the Kubernetes quantity and semver libraries on top of it.

cel-rust cannot carry Python objects as values, so quantities and versions travel as one-key
"tagged" maps holding a canonical spelling (equal values compare equal with ``==``).
The engine is imported lazily, and only from agent.explain: the daemon never pays for it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from agent.explain.docs import InputError
from agent.explain.model import Selector
from agent.explain.values import (
    Semver,
    ValueParseError,
    format_quantity,
    parse_quantity,
    parse_semver,
)

QTAG = "__quantity__"
VTAG = "__semver__"
INT64_MAX = 2**63 - 1


class SelectorRuntimeError(Exception):
    """A selector failed while evaluating on a device; the scheduler aborts allocation then."""

    def __init__(self, selector: Selector, device: str, cause: str) -> None:
        super().__init__(
            f"{selector.owner}: selector #{selector.index} on device {device}: "
            f"CEL runtime error: {cause}"
        )
        self.selector = selector
        self.device = device
        self.cause = cause


def load_cel() -> types.ModuleType:
    """Import the cel-rust extension without the package's CLI (prompt_toolkit: ~130 ms)."""
    pkg = sys.modules.get("cel")
    if pkg is not None and hasattr(pkg, "compile"):
        return pkg
    spec = importlib.util.find_spec("cel")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("", "explain needs the common-expression-language package (pip install "
                         "'dra-agent[explain]')")
    where = list(spec.submodule_search_locations)
    ext_spec = importlib.machinery.PathFinder.find_spec("cel.cel", where)
    if ext_spec is None or ext_spec.loader is None:
        raise InputError("", "the cel package has no compiled extension")
    ext = importlib.util.module_from_spec(ext_spec)
    ext_spec.loader.exec_module(ext)
    # A stand-in package so that later "import cel" / "cel.stdlib" users get the same
    # extension instance (a PyO3 module can be initialised only once per process).
    pkg = types.ModuleType("cel")
    pkg.__path__ = where
    pkg.__dict__.update({k: v for k, v in vars(ext).items() if not k.startswith("__")})
    sys.modules["cel.cel"] = ext
    sys.modules["cel"] = pkg
    # The engine logs every failing Python callback at ERROR; a selector erroring on one device
    # is reported through our own result instead.
    logging.getLogger("cel").setLevel(logging.CRITICAL)
    return pkg


# --- quantity and semver libraries -------------------------------------------------------------

def _q(value: Fraction) -> dict[str, str]:
    return {QTAG: str(value)}


def _v(value: Semver) -> dict[str, str]:
    return {VTAG: str(value)}


def _as_q(value: Any) -> Fraction | None:
    if isinstance(value, dict) and len(value) == 1 and QTAG in value:
        return Fraction(value[QTAG])
    return None


def _as_v(value: Any) -> Semver | None:
    if isinstance(value, dict) and len(value) == 1 and VTAG in value:
        return parse_semver(value[VTAG])
    return None


def _overload(name: str, *args: Any) -> TypeError:
    kinds = ", ".join(type(a).__name__ if _as_q(a) is None and _as_v(a) is None
                      else ("quantity" if _as_q(a) is not None else "semver") for a in args)
    return TypeError(f"no such overload: {name}({kinds})")


def _compare(name: str, a: Any, b: Any) -> int:
    qa, qb = _as_q(a), _as_q(b)
    if qa is not None and qb is not None:
        return (qa > qb) - (qa < qb)
    va, vb = _as_v(a), _as_v(b)
    if va is not None and vb is not None:
        return va.compare(vb)
    raise _overload(name, a, b)


def _quantity(s: Any) -> dict[str, str]:
    if not isinstance(s, str):
        raise _overload("quantity", s)
    try:
        return _q(parse_quantity(s))
    except ValueParseError as err:
        raise ValueError(f"quantity({s!r}): {err}") from None


def _is_quantity(s: Any) -> bool:
    try:
        parse_quantity(s)
    except ValueParseError:
        return False
    return isinstance(s, str)


def _semver(s: Any, normalize: bool = False) -> dict[str, str]:
    try:
        return _v(parse_semver(s, normalize))
    except ValueParseError as err:
        raise ValueError(f"semver({s!r}): {err}") from None


def _is_semver(s: Any, normalize: bool = False) -> bool:
    try:
        parse_semver(s, normalize)
    except ValueParseError:
        return False
    return True


def _arith(name: str, sign: int) -> Callable[[Any, Any], dict[str, str]]:
    def op(a: Any, b: Any) -> dict[str, str]:
        qa = _as_q(a)
        qb = _as_q(b) if not isinstance(b, int) or isinstance(b, bool) else Fraction(b)
        if qa is None or qb is None:
            raise _overload(name, a, b)
        return _q(qa + sign * qb)

    return op


def _q_unary(name: str, fn: Callable[[Fraction], Any]) -> Callable[[Any], Any]:
    def op(a: Any) -> Any:
        qa = _as_q(a)
        if qa is None:
            raise _overload(name, a)
        return fn(qa)

    return op


def _as_integer(q: Fraction) -> int:
    if q.denominator != 1 or abs(q.numerator) > INT64_MAX:
        raise ValueError(f"cannot convert quantity {format_quantity(q)} to an int64")
    return q.numerator


def _v_part(name: str, index: int) -> Callable[[Any], int]:
    def op(a: Any) -> int:
        v = _as_v(a)
        if v is None:
            raise _overload(name, a)
        return (v.major, v.minor, v.patch)[index]

    return op


def k8s_functions() -> dict[str, Callable[..., Any]]:
    """The Kubernetes quantity and semver CEL libraries (method calls are plain functions here)."""
    return {
        "quantity": _quantity,
        "isQuantity": _is_quantity,
        "semver": _semver,
        "isSemver": _is_semver,
        "compareTo": lambda a, b: _compare("compareTo", a, b),
        "isGreaterThan": lambda a, b: _compare("isGreaterThan", a, b) > 0,
        "isLessThan": lambda a, b: _compare("isLessThan", a, b) < 0,
        "add": _arith("add", 1),
        "sub": _arith("sub", -1),
        "sign": _q_unary("sign", lambda q: (q > 0) - (q < 0)),
        "isInteger": _q_unary("isInteger", lambda q: q.denominator == 1),
        "asInteger": _q_unary("asInteger", _as_integer),
        "asApproximateFloat": _q_unary("asApproximateFloat", float),
        "major": _v_part("major", 0),
        "minor": _v_part("minor", 1),
        "patch": _v_part("patch", 2),
    }
