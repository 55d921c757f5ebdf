"""A checkpoint record this agent cannot read, kept for the one thing it still says: which
devices it holds.

A record its type refuses (a field of the wrong type, an unknown state, a name no claim can
have, a string that cannot be written back) is never dropped: dropping it frees its devices,
and the next claim allocated one of them is a double allocation (#28). ``salvage`` keeps it
as an *unreadable* record instead:

* ``recovered``, so nothing trusts it as proof that a claim is prepared, and no effect changes
  the host for it (``agent.prepare``: a recovered record only keeps its devices taken);
* holding the devices it names: every object anywhere in it with a ``pool`` and a ``device``
  that are names (a pool is DNS subdomains joined by ``/``, a device a DNS label), with no
  other field, so no effect has anything to act on;
* under its own key when that is a UID this node accepts, else under ``unreadable-<hash>``;
* with the reason it could not be read (``ClaimRecord.unreadable``, one ASCII line).

Its devices stay taken until the kubelet unprepares or prepares that claim UID again (the
record is replaced or dropped as any other), or an operator runs ``dra-agent claims --forget
UID`` (the only way for a record under an ``unreadable-`` key, which no kubelet names).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
from agent.claim.identity import name_problem, uid_problem
from agent.common.k8snames import dns_label_problem, dns_subdomain_problem

#: Key prefix of an unreadable record whose own key is no claim UID this node accepts.
KEY_PREFIX = "unreadable-"
#: The operator's line, logged once per start-up for each unreadable record (and when one is
#: found while running); ``dra-agent claims`` says the same.
HELD_LINE = ("a checkpoint record cannot be read; its devices stay taken until the kubelet "
             "unprepares that claim, or an operator runs: dra-agent claims --forget UID")
_MAX_REASON = 200


def unreadable_record(key: object, raw: object, reason: str,
                      taken: Collection[str] = ()) -> ClaimRecord:
    """The unreadable record of ``raw`` (stored under ``key``, refused for ``reason``); its
    key avoids ``taken`` (the other keys of the same file)."""
    uid = key if isinstance(key, str) and uid_problem(key) is None else _fresh_key(key, taken)
    obj: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    namespace, name = obj.get("namespace"), obj.get("name")
    if not (isinstance(namespace, str) and isinstance(name, str)
            and name_problem(namespace, name) is None):
        namespace = name = ""
    state = obj.get("state")
    known = {s.value: s for s in ClaimState}
    return ClaimRecord(
        uid=uid, namespace=namespace, name=name,
        state=known.get(state, ClaimState.PREPARE_STARTED) if isinstance(state, str)
        else ClaimState.PREPARE_STARTED,
        devices=tuple(PreparedDevice(pool=p, device=d, requests=()) for p, d in named(raw)),
        recovered=True, unreadable=one_line(reason),
    )


def named(raw: object) -> list[tuple[str, str]]:
    """Every (pool, device) pair of names anywhere in ``raw``, once each, in order."""
    out: dict[tuple[str, str], None] = {}
    for obj in _objects(raw):
        pool, device = obj.get("pool"), obj.get("device")
        if isinstance(pool, str) and isinstance(device, str) and pool_problem(pool) is None \
                and dns_label_problem(device) is None:
            out[(pool, device)] = None
    return list(out)


def pool_problem(pool: str) -> str | None:
    """Why ``pool`` is no ResourceSlice pool name (DNS subdomains joined by ``/``)."""
    if len(pool) > 253:
        return f"must be at most 253 characters, is {len(pool)}"
    for part in pool.split("/"):
        if (why := dns_subdomain_problem(part)) is not None:
            return why
    return None


def one_line(text: str) -> str:
    """``text`` as one ASCII line of at most 200 characters (it names what was refused,
    which may hold anything)."""
    return ascii(text)[1:-1][:_MAX_REASON]


def _objects(raw: object) -> Iterator[Mapping[str, Any]]:
    """Every JSON object in ``raw``, without recursion (the parser allows deep nesting)."""
    stack = [raw]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            yield value
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))


def _fresh_key(key: object, taken: Collection[str]) -> str:
    base = KEY_PREFIX + hashlib.sha256(ascii(key).encode()).hexdigest()[:16]
    uid, n = base, 1
    while uid in taken:
        uid, n = f"{base}-{n}", n + 1
    return uid
