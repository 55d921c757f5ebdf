"""Which claim identities this node accepts: a UID that a CDI device name and a spec's file
name can hold, and a namespace and name the API server could have given. Checked before any
other work, since both end up in paths and in requests sent with the agent's credentials."""

from __future__ import annotations

import re

from agent.claim.model import ClaimError, ClaimRef
from agent.common.k8snames import dns_label_problem, dns_subdomain_problem

#: Longest claim UID accepted. The API server's UIDs are 36-character UUIDs; the bound keeps
#: ``k8s.<driver>-claim_<uid>.json`` well under the 255-byte file name limit.
UID_MAX_LEN = 128
# A claim UID becomes part of a CDI device name (``<uid>-<device>``) and of the spec's file
# name, so it may hold only what both can: letters, digits and ``_ . : -``, starting and ending
# with a letter or digit. No ``/``, NUL, newline or non-ASCII can get as far as a path.
_UID_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?", re.ASCII)


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot be a claim UID on this node, or None when it can."""
    if not uid:
        return "the claim UID is empty"
    if len(uid) > UID_MAX_LEN:
        return f"the claim UID is {len(uid)} characters long (at most {UID_MAX_LEN})"
    if not _UID_RE.fullmatch(uid):
        return (
            f"the claim UID {uid!r} is not one the API server generates: only letters, digits "
            "and '_.:-', starting and ending with a letter or digit, fit in a CDI device name"
        )
    return None


def name_problem(namespace: str, name: str) -> str | None:
    """Why ``namespace``/``name`` cannot be a ResourceClaim's, or None when they can.

    The API server only ever names claims so (a namespace is a DNS label, a claim a DNS
    subdomain). Anything else from the kubelet socket would end up in a request path sent
    with the agent's credentials (``..``, ``/``, ``?``), so it is refused before any request.
    """
    if (why := dns_label_problem(namespace)) is not None:
        return f"the claim namespace {namespace!r} is not a DNS label: {why}"
    if (why := dns_subdomain_problem(name)) is not None:
        return f"the claim name {name!r} is not a DNS subdomain: {why}"
    return None


def check_uid(ref: ClaimRef) -> None:
    """Refuse a claim UID that no CDI name or spec file can hold, and a namespace or name no
    claim can have, before any other work."""
    problem = uid_problem(ref.uid) or name_problem(ref.namespace, ref.name)
    if problem is not None:
        raise ClaimError(str(ref), problem)
