"""The smallest change that would make a claim fit, worded for an operator."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.explain.model import ALL, Claim
from agent.explain.reasons import (
    CONSTRAINT,
    COUNTERS,
    IN_CLAIM,
    NODE,
    SELECTOR,
    SELECTOR_ERROR,
    DeviceVerdict,
    RequestReport,
)
from agent.explain.result import PoolReport

if TYPE_CHECKING:
    from agent.explain.allocator import Search

_ORDINAL = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


def _at(v: DeviceVerdict) -> str:
    return f"{v.device} under {v.where}" if v.where else v.device


def _shortfall(r: RequestReport) -> str:
    need = max(r.needed, 1)  # All mode: every matching device (none matching: at least one)
    free = r.usable
    blocked = [v for v in r.devices if v.reason is not None
               and v.reason.code not in (SELECTOR, SELECTOR_ERROR, NODE, CONSTRAINT, IN_CLAIM)]
    if (r.mode == ALL and r.matching == 0) or r.matching < need:
        misses = Counter(str(v.reason.detail.get("failing")) for v in r.devices
                         if v.reason is not None and v.reason.code == SELECTOR
                         and str(v.reason.detail.get("owner", "")).startswith("request"))
        text = (f"request {r.request} needs {need} device(s) of class {r.device_class} but only "
                f"{r.matching} match its selectors")
        if misses:
            part, n = misses.most_common(1)[0]
            text += f"; {n} more fail only the request selector part `{part}`: relax it"
        elif r.matching:
            text += f"; lower count to {r.matching}"
        return text
    missing = need - free
    lines = [f"request {r.request}: {free} of {need} device(s) that match are free"]
    for i, v in enumerate(blocked[:missing]):
        assert v.reason is not None
        nth = _ORDINAL[free + i] if free + i < len(_ORDINAL) else f"#{free + i + 1}"
        lines.append(f"the {nth}, {_at(v)}, is not: {v.reason.message}")
    return "; ".join(lines)


def _constraint_hint(claim: Claim, reports: Sequence[RequestReport], search: Search
                     ) -> str | None:
    """The constraint that decides, as one fact: which value comes closest and what it lacks
    (matchAttribute), or how few distinct values there are (distinctAttribute)."""
    by_name = {r.request: r for r in reports}
    devices = {e.device.id: e.device for e in search.entries}
    for c in claim.constraints:
        names = list(c.requests) or [r.request for r in reports]
        involved = [by_name[n] for n in names if n in by_name and by_name[n].status != "skipped"]
        if not involved:
            continue
        per_value: dict[str, Counter[str]] = {}
        for r in involved:
            for v in r.devices:
                if v.reason is None or v.reason.code in (CONSTRAINT, IN_CLAIM):
                    found = devices[(v.driver, v.pool, v.device)].attribute(c.attribute)
                    if found is not None:
                        per_value.setdefault(str(found[1]), Counter())[r.request] += 1
        which = ", ".join(r.request for r in involved)
        short = c.attribute.rpartition("/")[2]
        if not per_value:
            return (f"constraint {c.kind} {c.attribute}: no free device of request(s) {which} "
                    "has the attribute")
        if c.match_attribute:
            hint = _match_hint(c.attribute, short, involved, per_value)
        else:
            hint = _distinct_hint(c.attribute, short, which, involved, per_value)
        if hint:
            return hint
    return None


def _match_hint(attribute: str, short: str, involved: Sequence[RequestReport],
                per_value: dict[str, Counter[str]]) -> str | None:
    def need(r: RequestReport) -> int:
        return max(r.needed, 1)

    best = max(sorted(per_value), key=lambda k: sum(min(per_value[k][r.request], need(r))
                                                    for r in involved))
    lacking = [r for r in involved if per_value[best][r.request] < need(r)]
    if not lacking:
        return None  # some value suits every request: another constraint decides
    if len(involved) == 1:
        (r,) = involved
        return (f"constraint matchAttribute {attribute}: no {short} has {need(r)} free devices "
                f"for request {r.request}; the most any has is {per_value[best][r.request]} "
                f"({best})")
    return (f"constraint matchAttribute {attribute}: no {short} has free devices for all of "
            f"{', '.join(r.request for r in involved)}; closest is {best}, where "
            + "; ".join(f"{r.request} has {per_value[best][r.request]} of {need(r)}"
                        for r in lacking))


def _distinct_hint(attribute: str, short: str, which: str, involved: Sequence[RequestReport],
                   per_value: dict[str, Counter[str]]) -> str | None:
    total = sum(max(r.needed, 1) for r in involved)
    if len(per_value) >= total:
        return None
    values = sorted(per_value)
    shown = ", ".join(values[:6]) + (f" +{len(values) - 6} more" if len(values) > 6 else "")
    return (f"constraint distinctAttribute {attribute}: request(s) {which} need {total} "
            f"devices with different {short} values, but their free devices have only "
            f"{len(values)} ({shown})")


def suggest(claim: Claim, reports: Sequence[RequestReport], pools: Sequence[PoolReport],
            search: Search, error: str | None) -> str:
    bad = [f"pool {p.driver}/{p.pool} is {p.status} ({p.message}); its devices are not "
           "offered until the driver finishes publishing it" if p.status == "incomplete" else
           f"pool {p.driver}/{p.pool} is {p.status} ({p.message}); the scheduler ignores it"
           for p in pools if p.status != "ok"]
    text = _suggest(claim, reports, pools, search, error)
    if bad and not any(b in text for b in bad):
        text = "; ".join(bad) if all(p.status != "ok" for p in pools) else (
            text + "; also " + "; ".join(bad))
    return text


def _suggest(claim: Claim, reports: Sequence[RequestReport], pools: Sequence[PoolReport],
             search: Search, error: str | None) -> str:
    if error:
        for r in reports:
            for v in r.devices:
                if v.reason is not None and v.reason.code == SELECTOR_ERROR:
                    return (f"fix the selector: {v.reason.message} on {v.device}; guard optional "
                            "attributes with has(...) or test the device type first")
        bad = [p for p in pools if p.status != "ok"]
        if bad:
            return "; ".join(f"pool {p.driver}/{p.pool} is {p.status} ({p.message})" for p in bad)
        return error
    if not pools:
        return f"no ResourceSlice publishes devices for node {search.node.name}"
    # Per claim request: the alternative with the smallest shortfall, if none can work alone.
    by_base: dict[str, list[RequestReport]] = {}
    for r in reports:
        by_base.setdefault(r.request.split("/")[0], []).append(r)
    for alts in by_base.values():
        feasible = [r for r in alts if r.usable >= max(r.needed, 1)]
        if not feasible:
            best = min(alts, key=lambda r: r.needed - r.usable)
            return _shortfall(best)
    hint = _constraint_hint(claim, reports, search)
    if hint:
        return hint
    for r in reports:
        for v in r.devices:
            if v.reason is not None and v.reason.code == COUNTERS:
                return f"shared counters run out: {_at(v)} {v.reason.message}"
    firsts = [f"{r.request}: {_at(v)} {v.reason.message}" for r in reports for v in r.devices
              if v.reason is not None and v.reason.code == CONSTRAINT][:2]
    if firsts:
        return "the requests conflict through the claim's constraints: " + "; ".join(firsts)
    return "each request can be met alone but not all together; split the claim or free devices"
