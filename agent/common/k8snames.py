"""Kubernetes object-name rules (apimachinery's IsDNS1123Label / IsDNS1123Subdomain), shared by
the slice validator and the claim checks. Matched whole: ``re.match`` with ``$`` would let a
trailing newline through."""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*", re.ASCII)


def dns_subdomain_problem(value: str, limit: int = 253) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"must be at most {limit} characters, is {len(value)}"
    if not _DNS_SUBDOMAIN.fullmatch(value):
        return "must be a lowercase DNS subdomain ([a-z0-9] and '-', parts separated by '.')"
    return None


def dns_label_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > 63:
        return f"must be at most 63 characters, is {len(value)}"
    if not _DNS_LABEL.fullmatch(value):
        return "must be a DNS label (lowercase [a-z0-9] and '-', starting and ending alphanumeric)"
    return None
