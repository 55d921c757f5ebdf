"""CDI naming rules: vendor, class, device names and ``vendor/class=name`` qualified names.

The rules are those the reference CDI library enforces when it loads a spec, plus two of our
own that keep old runtimes working: one-character vendors and classes are refused (the 0.5.x
library panics on them) and the lengths SPEC.md states are enforced (the library does not).
"""

from __future__ import annotations

import re

from cdi.errors import CDINameError

_VENDOR_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = _VENDOR_RE
_DEVICE_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

MAX_VENDOR_LEN = 253  # a DNS subdomain, as SPEC.md describes the "prefix"
MAX_CLASS_LEN = 63  # SPEC.md's limit for the "name segment"


def _check(kind: str, name: str, pattern: re.Pattern[str], rule: str) -> None:
    if not name:
        raise CDINameError(kind, name, "must not be empty")
    if not name.isascii() or pattern.fullmatch(name) is None:
        raise CDINameError(kind, name, rule)


def validate_vendor(vendor: str) -> None:
    """Raise ``CDINameError`` unless ``vendor`` is a valid CDI vendor (``k8s.dra-agent.io``)."""
    _check(
        "vendor",
        vendor,
        _VENDOR_RE,
        "must start with a letter, end with a letter or digit and hold only letters, "
        "digits, '_', '-' and '.'",
    )
    if len(vendor) < 2:
        raise CDINameError("vendor", vendor, "one-character vendors crash CDI library 0.5.x")
    if len(vendor) > MAX_VENDOR_LEN:
        raise CDINameError("vendor", vendor, f"longer than {MAX_VENDOR_LEN} characters")


def validate_class(class_: str) -> None:
    """Raise ``CDINameError`` unless ``class_`` is a valid class (a dot needs cdiVersion 0.6.0)."""
    _check(
        "class",
        class_,
        _CLASS_RE,
        "must start with a letter, end with a letter or digit and hold only letters, "
        "digits, '_', '-' and '.'",
    )
    if len(class_) < 2:
        raise CDINameError("class", class_, "one-character classes crash CDI library 0.5.x")
    if len(class_) > MAX_CLASS_LEN:
        raise CDINameError("class", class_, f"longer than {MAX_CLASS_LEN} characters")


def validate_device_name(name: str) -> None:
    """Raise ``CDINameError`` unless ``name`` is a valid CDI device name.

    A name starting with a digit is valid but needs cdiVersion 0.5.0 (``minimal_version``
    accounts for it).
    """
    _check(
        "device name",
        name,
        _DEVICE_RE,
        "must start and end with a letter or digit and hold only letters, digits, "
        "'_', '-', '.' and ':'",
    )


def validate_kind(kind: str) -> tuple[str, str]:
    """Split and check a spec ``kind`` (``vendor/class``)."""
    vendor, sep, class_ = kind.partition("/")
    if not sep:
        raise CDINameError("kind", kind, "must have the form vendor/class")
    validate_vendor(vendor)
    validate_class(class_)
    return vendor, class_


def qualified_name(vendor: str, class_: str, name: str) -> str:
    """``vendor/class=name``, after checking each part."""
    validate_vendor(vendor)
    validate_class(class_)
    validate_device_name(name)
    return f"{vendor}/{class_}={name}"


def parse_qualified_name(qualified: str) -> tuple[str, str, str]:
    """Split ``vendor/class=name`` on the first '/' and the first '=' and check each part."""
    if qualified.startswith("/"):
        raise CDINameError("qualified name", qualified, "a path is not a CDI device name")
    kind, eq, name = qualified.partition("=")
    vendor, slash, class_ = kind.partition("/")
    if not slash or not eq:
        raise CDINameError("qualified name", qualified, "must have the form vendor/class=name")
    validate_vendor(vendor)
    validate_class(class_)
    validate_device_name(name)
    return vendor, class_, name


def is_qualified_name(qualified: str) -> bool:
    try:
        parse_qualified_name(qualified)
    except CDINameError:
        return False
    return True
