"""The DRA CEL environment for device selectors, on the cel-rust engine.

An expression sees one variable, ``device``, with ``driver``, ``allowMultipleAllocations``,
``attributes[domain][name]`` and ``capacity[domain][name]``. Unqualified attribute names belong to
the driver's domain; a domain the device lacks is an empty map (cel-rust has no map-with-default,
so domains the expressions name as literals are seeded). When every expression reads attributes
only as ``device.attributes["domain"].name`` the device is converted with just those entries,
which is most of the evaluation cost.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from agent.explain.cel_lib import QTAG, VTAG, SelectorRuntimeError, k8s_functions, load_cel
from agent.explain.devices import Device
from agent.explain.docs import InputError
from agent.explain.model import Selector, device_id_str
from agent.explain.values import parse_semver

#: Functions of CEL itself and of the libraries Kubernetes adds that selectors may call.
_BUILTINS = frozenset({
    "size", "matches", "startsWith", "endsWith", "contains", "int", "uint", "double", "string",
    "bytes", "bool", "duration", "timestamp", "dyn", "type", "has", "all", "exists",
    "exists_one", "map", "filter",
})
_EXTRAS = ("core", "strings", "math", "sets", "lists")
_MACRO_VAR = r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*{name}\s*,"
_REF = re.compile(
    r"""device\s*\.\s*(attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]\s*"""
    r"""(?:\.\s*([A-Za-z_]\w*)\b(?!\s*\()|\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\])"""
)
_ANY_REF = re.compile(r"device\s*\.\s*(?:attributes|capacity)\b")
_LITERAL = re.compile(r""""((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)'""")
_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")

Ref = tuple[str, str, str]  # ("attributes"|"capacity", domain, name)


@dataclass(slots=True)
class CompiledSelector:
    selector: Selector
    program: Any
    parts: tuple[tuple[str, Any], ...]  # the conjuncts of a top-level && chain
    refs: frozenset[Ref] | None  # None: reads the device in ways we cannot project
    domains: frozenset[str]  # string literals: possible domain names to seed


@dataclass(slots=True)
class CelStats:
    compiled: int = 0
    compile_seconds: float = 0.0
    evaluations: int = 0
    eval_seconds: float = 0.0
    conversions: int = 0
    convert_seconds: float = 0.0


def split_conjuncts(expr: str) -> list[str]:
    """Split ``a && b && c`` at top level; one part when there is a top-level || or ?:."""
    parts, depth, start, i, quote = [], 0, 0, 0, ""
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and (expr.startswith("||", i) or ch == "?"):
            return [expr.strip()]
        elif depth == 0 and expr.startswith("&&", i):
            parts.append(expr[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    parts.append(expr[start:].strip())
    return [p for p in parts if p]


def _projection(expr: str) -> frozenset[Ref] | None:
    refs = []
    for m in _REF.finditer(expr):
        domain = m.group(2) if m.group(2) is not None else m.group(3)
        name = m.group(4) or m.group(5) or m.group(6) or ""
        refs.append((m.group(1), domain, name))
    if len(refs) != len(_ANY_REF.findall(expr)):
        return None
    return frozenset(refs)


class CelEnv:
    """Compiles selectors once and evaluates them on devices, one device bound at a time."""

    def __init__(self) -> None:
        self._cel = load_cel()
        functions = dict(k8s_functions())
        try:
            from cel import stdlib

            for lib in _EXTRAS:
                functions.update({k: v for k, v in stdlib.EXTENSIONS[lib].items()
                                  if k not in functions and k != "bool"})
        except (ImportError, AttributeError, KeyError):  # older engine: core CEL only
            pass
        self._known = _BUILTINS | frozenset(functions)
        self._ctx = self._cel.Context(None, functions)
        self._programs: dict[str, Any] = {}
        self._compiled: dict[tuple[str, str, int], CompiledSelector] = {}
        self._refs: frozenset[Ref] | None = frozenset()
        self._domains: frozenset[str] = frozenset()
        # (is an attribute, domain, name, "domain/name") of each ref, in sorted order
        self._ref_plan: list[tuple[bool, str, str, str]] = []
        self._views: dict[tuple[Any, ...], int] = {}
        self._keys: dict[int, int] = {}  # id(Device) -> view number
        self._bound: int | None = None
        self._results: dict[tuple[str, int], bool | str] = {}
        self._parts: dict[tuple[str, int], str] = {}
        self.stats = CelStats()

    # --- compile --------------------------------------------------------------------------

    def _program(self, expr: str, selector: Selector) -> Any:
        prog = self._programs.get(expr)
        if prog is not None:
            return prog
        start = time.perf_counter()
        try:
            prog = _parsed(self._cel, expr)
        except Exception as err:  # the engine raises ValueError with the parser's message
            raise InputError(selector.where, self._compile_message(selector, str(err))) from None
        finally:
            self.stats.compile_seconds += time.perf_counter() - start
            self.stats.compiled += 1
        for fn in prog.functions():
            if fn[0] in "_@!" or fn in self._known:
                continue
            raise InputError(selector.where, f"{selector.owner} selector #{selector.index}: "
                             f"undeclared reference to '{fn}' in: {selector.expression}")
        for var in prog.variables():
            if var == "device" or re.search(_MACRO_VAR.format(name=re.escape(var)), expr):
                continue
            raise InputError(selector.where, f"{selector.owner} selector #{selector.index}: "
                             f"undeclared reference to '{var}' (only 'device' is defined) in: "
                             f"{selector.expression}")
        self._programs[expr] = prog
        return prog

    @staticmethod
    def _compile_message(selector: Selector, raw: str) -> str:
        head = f"{selector.owner} selector #{selector.index} does not compile"
        m = _POSITION.search(raw)
        if not m:
            return f"{head}: {raw}"
        line, col, what = int(m.group(1)), int(m.group(2)), m.group(3)
        src = selector.expression.splitlines()[line - 1] if selector.expression else ""
        return f"{head}: {what} at line {line} column {col + 1}\n  {src}\n  {' ' * col}^"

    def compile(self, selector: Selector) -> CompiledSelector:
        key = (selector.owner, selector.expression, selector.index)
        found = self._compiled.get(key)
        if found is not None:
            return found
        expr = selector.expression
        program = self._program(expr, selector)
        conj = split_conjuncts(expr)
        parts = tuple((p, self._program(p, selector)) for p in conj) if len(conj) > 1 else ()
        literals = frozenset(a if a else b for a, b in _LITERAL.findall(expr))
        cs = CompiledSelector(selector, program, parts, _projection(expr), literals)
        self._compiled[key] = cs
        self._refs = None if self._refs is None or cs.refs is None else self._refs | cs.refs
        self._domains |= literals
        self._ref_plan = [(what == "attributes", domain, ident, f"{domain}/{ident}")
                          for what, domain, ident in sorted(self._refs or ())]
        # The projection may have grown: what was cached describes other keys.
        self._keys.clear()
        self._views.clear()
        self._results.clear()
        self._parts.clear()
        self._bound = None
        return cs

    # --- evaluate -------------------------------------------------------------------------

    def _value(self, device: Device) -> dict[str, Any]:
        attrs: dict[str, dict[str, Any]] = {}
        caps: dict[str, dict[str, Any]] = {}
        if self._refs is None:
            for d in self._domains:
                attrs[d], caps[d] = {}, {}
            for name, (kind, value) in device.attributes.items():
                domain, ident = _split(name, device.driver)
                attrs.setdefault(domain, {})[ident] = _attr(kind, value)
            for name, cap in device.capacity.items():
                domain, ident = _split(name, device.driver)
                caps.setdefault(domain, {})[ident] = {QTAG: str(cap.value)}
        else:
            for what, domain, ident in self._refs:
                target = attrs if what == "attributes" else caps
                entries = target.setdefault(domain, {})
                qualified = ident if domain == device.driver else f"{domain}/{ident}"
                if what == "attributes":
                    found = device.attributes.get(qualified) or device.attributes.get(
                        f"{domain}/{ident}")
                    if found is not None:
                        entries[ident] = _attr(*found)
                else:
                    c = device.capacity.get(qualified) or device.capacity.get(f"{domain}/{ident}")
                    if c is not None:
                        entries[ident] = {QTAG: str(c.value)}
            for d in self._domains:
                attrs.setdefault(d, {})
                caps.setdefault(d, {})
        return {"driver": device.driver, "allowMultipleAllocations": device.allow_multiple,
                "attributes": attrs, "capacity": caps}

    def view(self, device: Device) -> int:
        """Devices with the same view get the same verdict from every compiled selector."""
        return self._key(device)

    def _key(self, device: Device) -> int:
        """What the expressions can see of the device, as a small number: equal views give
        equal verdicts, so eight identical GPUs cost one evaluation, not eight."""
        known = self._keys.get(id(device))  # the Device objects live as long as this env
        if known is not None:
            return known
        if self._refs is None:
            seen: tuple[Any, ...] = (
                tuple(sorted((k, _hashable(v)) for k, v in device.attributes.items())),
                tuple(sorted((k, _quantity_key(c.value)) for k, c in device.capacity.items())))
        else:
            looked: list[Any] = []
            attrs, caps, driver = device.attributes, device.capacity, device.driver
            for is_attr, domain, ident, qualified in self._ref_plan:
                table: Any = attrs if is_attr else caps
                found = table.get(ident) if domain == driver else None
                if found is None:
                    found = table.get(qualified)
                if found is None:
                    looked.append(None)
                elif is_attr:
                    looked.append(_hashable(found) if type(found[1]) is list else found)
                else:
                    looked.append(_quantity_key(found.value))
            seen = tuple(looked)
        view = (device.driver, device.allow_multiple, seen)
        number = self._views.setdefault(view, len(self._views))
        self._keys[id(device)] = number
        return number

    def _bind(self, device: Device, key: int) -> None:
        if self._bound == key:
            return
        start = time.perf_counter()
        self._ctx.add_variable("device", self._value(device))
        self._bound = key
        self.stats.conversions += 1
        self.stats.convert_seconds += time.perf_counter() - start

    def _run(self, program: Any, device: Device, key: int) -> bool | str:
        """True/False, or the error text."""
        self._bind(device, key)
        start = time.perf_counter()
        try:
            result = program.execute(self._ctx)
        except Exception as err:
            return _cause(err)
        finally:
            self.stats.evaluations += 1
            self.stats.eval_seconds += time.perf_counter() - start
        if not isinstance(result, bool):
            return f"must evaluate to bool, not {type(result).__name__}"
        return result

    def matches(self, cs: CompiledSelector, device: Device) -> bool:
        """The selector's verdict; raises SelectorRuntimeError as the scheduler would fail."""
        key = self._key(device)
        found = self._results.get((cs.selector.expression, key))
        if found is None:
            found = self._results[(cs.selector.expression, key)] = self._run(
                cs.program, device, key)
        if isinstance(found, str):
            raise SelectorRuntimeError(cs.selector, device_id_str(device.id), found)
        return found

    def failing_part(self, cs: CompiledSelector, device: Device) -> str:
        """The first conjunct of a && chain that is false on the device (else the whole)."""
        key = self._key(device)
        found = self._parts.get((cs.selector.expression, key))
        if found is not None:
            return found
        found = cs.selector.expression
        for text, program in cs.parts:
            if self._run(program, device, key) is False:  # an error is not "false": go on
                found = text
                break
        self._parts[(cs.selector.expression, key)] = found
        return found


@lru_cache(maxsize=256)
def _parsed(engine: Any, expr: str) -> Any:
    """The engine's program for ``expr``, kept across explain calls: the parse is most of a
    small explain (8 programs of the bench claim: 1.8 M of its 10 M instructions), a program
    holds no state of its own (a call's variables live in its Context), and the same class
    and request selectors come back call after call. A text that does not compile raises
    every time (an exception is not kept)."""
    return engine.compile(expr)


def _quantity_key(value: Fraction) -> tuple[int, int]:
    """A quantity as a view's key: equal exactly when the values are (a Fraction is kept
    normalised), without Fraction's hash, which is Python code."""
    return value.numerator, value.denominator


def _hashable(attr: tuple[str, Any]) -> tuple[str, Any]:
    kind, value = attr
    return (kind, tuple(value)) if isinstance(value, list) else (kind, value)


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attr(kind: str, value: Any) -> Any:
    if kind == "version":
        return {VTAG: str(parse_semver(value))}
    if kind == "versions":
        return [{VTAG: str(parse_semver(v))} for v in value]
    return value


def _cause(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"no such key: {err.args[0] if err.args else err}"
    return str(err) or type(err).__name__

