"""After the search: each request's report, a verdict for every device of the node, picked
or with the reason it was not (``RequestReport``, ``DeviceVerdict``).

A reason that needs no search state (selectors, held by another claim, capacity, counters,
taints) is the same whatever the search did; the rest is judged against the solution found,
or, when none was, taken from what the search noted while it backtracked.

Most devices are plain: selected for the whole slice (no per-device node selection), no
counters, no taints, no capacity shared out to other claims. For those a request's verdict
can only depend on what its selectors see of the device (its CEL view), the claim holding it,
the claim's request that took it and the device's value of each constraint's attribute, so
each of those is judged once per distinct value and its Reason shared (``_Judge``); the rest go
through the full checks. The order of the CEL evaluations is the same either way.
"""

from __future__ import annotations

from typing import Any

from agent.explain.allocator import Search, SearchAbortedError
from agent.explain.candidates import Entry, ReqData
from agent.explain.constraints import Tracker, applies, value_key
from agent.explain.matching import capacity_check, taint_reason
from agent.explain.model import DeviceID
from agent.explain.reasons import (
    ALLOCATED,
    IN_CLAIM,
    SELECTOR_ERROR,
    DeviceVerdict,
    Reason,
    RequestReport,
)

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
#: Not looked at yet (a Reason, so that the caches stay typed; never in a verdict).
_UNSET = Reason("", "")


def _split(qualified: str) -> tuple[str, str]:
    """(domain, name) of a qualified attribute name, as ``Device.attribute`` splits it."""
    domain, _, ident = qualified.partition("/")
    return domain, ident


_ROOT_DOMAIN, _ROOT_NAME = _split(PCIE_ROOT)


def _static_reason(search: Search, rd: ReqData, entry: Entry) -> Reason | None:
    try:
        reason = search.selectable(rd, entry)
    except SearchAbortedError as err:
        return err.reason
    if reason is not None:
        return reason
    device = entry.device
    holder = search.state.devices.get(entry.did)
    if holder is not None and not rd.req.admin_access:
        return Reason(ALLOCATED, f"allocated to claim {holder}", {"claim": holder})
    reason = capacity_check(rd.req, device, search.state.capacity.get(entry.did), None)
    if reason is None and device.consumes:
        saved = search.consumed_counters
        search.consumed_counters = {}
        try:
            reason = search.counters(entry, commit=False)
        finally:
            search.consumed_counters = saved
    return reason or taint_reason(rd.req, device)


def _final_reason(search: Search, rd: ReqData, entry: Entry) -> Reason | None:
    """Against the solution found (not some state the search backtracked from)."""
    reason = search.in_use(rd, entry.did, entry.device.allow_multiple)
    if reason is None and entry.device.consumes:
        reason = search.counters(entry, commit=False)
    for t in search.trackers:
        if reason is None:
            reason = t.check(rd.req.base, rd.req.sub, entry.device)
    return reason


class _Shared:
    """Reasons the judges of one claim share, so that a device's verdicts for two requests
    that fail it alike can be one object: a selector's is interned by its content, a holder's
    and a taker's are made once."""

    def __init__(self) -> None:
        self._interned: dict[tuple[str, str, str], Reason] = {}
        self._allocated: dict[str, Reason] = {}
        self._in_claim: dict[str, Reason] = {}

    def intern(self, reason: Reason) -> Reason:
        return self._interned.setdefault((reason.code, reason.message, repr(reason.detail)),
                                         reason)

    def allocated(self, holder: str) -> Reason:
        found = self._allocated.get(holder)
        if found is None:
            found = self._allocated[holder] = Reason(
                ALLOCATED, f"allocated to claim {holder}", {"claim": holder})
        return found

    def in_claim(self, taker: str) -> Reason:
        found = self._in_claim.get(taker)
        if found is None:
            found = self._in_claim[taker] = Reason(
                IN_CLAIM, f"already chosen for request {taker}", {"request": taker})
        return found


class _Judge:
    """One request alternative's verdicts, with the answers for plain devices (see the
    module's docstring) kept per distinct input."""

    def __init__(self, search: Search, rd: ReqData, fits: bool,
                 chosen: set[DeviceID], shared: _Shared) -> None:
        self.search, self.rd, self.fits, self.chosen = search, rd, fits, chosen
        self.shared = shared
        self.verdicts: list[DeviceVerdict] = []
        self.error = False  # a selector failed at runtime on some device
        # Admin access may take a device another claim holds: always the full checks.
        self.fast = not rd.req.admin_access
        self.dynamic = search.dynamic.get(rd.key, {})
        #: (attribute's qualified name, its domain, its name, tracker, value -> reason)
        self.trackers: list[tuple[str, str, str, Tracker, dict[Any, Reason | None]]] = [
            (t.constraint.attribute, *_split(t.constraint.attribute), t, {})
            for t in search.trackers if applies(t.constraint, rd.req.base, rd.req.sub)]
        #: CEL view -> the selectors' reason (None: they pass), for plain devices
        self.selectors: dict[int, Reason | None] = {}

    def selector_reason(self, entry: Entry, view: int) -> Reason | None:
        """The selectors' verdict for the first plain device of a view."""
        try:
            reason = self.search.selectable(self.rd, entry)
        except SearchAbortedError as err:
            reason = err.reason  # the same for every device of this view
        if reason is not None:
            self.error |= reason.code == SELECTOR_ERROR
            reason = self.shared.intern(reason)
        self.selectors[view] = reason
        return reason

    def plain(self, entry: Entry, holder: str | None) -> Reason | None:
        """The verdict of a plain device its selectors pass (None: picked or a candidate)."""
        if entry.did in self.chosen:
            return None
        if holder is not None:
            return self.shared.allocated(holder)
        req = self.rd.req
        if req.capacity:
            reason = capacity_check(req, entry.device, None, None)
            if reason is not None:
                return reason
        if not self.fits:
            return self._dynamic(entry)
        # _final_reason, for a device no other claim holds
        taker = self.search.allocating.get(entry.did)
        if taker is not None:
            return self.shared.in_claim(taker)
        device = entry.device
        attrs = device.attributes
        for qualified, domain, ident, t, seen in self.trackers:
            value = attrs.get(qualified)  # device.attribute(qualified), inline
            if value is None and ident and domain == device.driver:
                value = attrs.get(ident)
            key = None if value is None else value_key(value)
            reason = seen.get(key, _UNSET)
            if reason is _UNSET:  # the tracker's state is final: same value, same answer
                reason = seen[key] = t.check(req.base, req.sub, device)
            if reason is not None:
                return reason
        return None

    def full(self, entry: Entry) -> Reason | None:
        """The verdict of any device, through every check (None: picked or a candidate)."""
        reason = _static_reason(self.search, self.rd, entry)
        if reason is not None:
            self.error |= reason.code == SELECTOR_ERROR
        if entry.did in self.chosen:
            return None
        if reason is None:
            reason = _final_reason(self.search, self.rd, entry) if self.fits \
                else self._dynamic(entry)
        return reason

    def _dynamic(self, entry: Entry) -> Reason | None:
        reason = self.dynamic.get(entry.did)
        if reason is not None:
            self.error |= reason.code == SELECTOR_ERROR
        return reason


def request_reports(search: Search, fits: bool) -> list[RequestReport]:
    """One report per request alternative, in claim order."""
    chosen: dict[tuple[int, int], list[str]] = {}
    chosen_ids: dict[tuple[int, int], set[DeviceID]] = {}
    for r in search.results:
        ri = next(i for i, cr in enumerate(search.claim.requests) if cr.name == r.req.base)
        si = search.claim.requests[ri].alternatives.index(r.req)
        chosen.setdefault((ri, si), []).append(r.entry.device.name)
        chosen_ids.setdefault((ri, si), set()).add(r.entry.did)
    shared = _Shared()
    judges = {key: _Judge(search, rd, fits, chosen_ids.get(key, set()), shared)
              for key, rd in search.data.items()}
    in_order = list(judges.values())
    env, held, shared_capacity = search.env, search.state.devices, search.state.capacity
    plans = [(j, j.selectors, j.chosen, j.verdicts.append) for j in in_order]
    for entry in search.entries:  # device-major: one CEL binding per device
        d = entry.device
        did, driver, pool, name, attrs = entry.did, d.driver, d.pool, d.name, d.attributes
        plain = not (entry.per_device or d.consumes or d.taints or did in shared_capacity)
        view = env.view(d) if plain else -1
        holder = held.get(did)
        found = attrs.get(PCIE_ROOT)  # the location: d.attribute(PCIE_ROOT), inline
        if found is None and driver == _ROOT_DOMAIN:
            found = attrs.get(_ROOT_NAME)
        where = str(found[1]) if found else ""
        # The device's verdicts so far, by reason (a verdict with none: by whether it was
        # picked): requests that judge it alike share one verdict object.
        made: dict[int, DeviceVerdict] = {}
        for judge, selectors, picks, append in plans:
            if plain and judge.fast:
                reason = selectors.get(view, _UNSET)
                if reason is _UNSET:
                    reason = judge.selector_reason(entry, view)
                if reason is None:
                    reason = judge.plain(entry, holder)
                elif did in picks:  # never: the search picks no device they refuse
                    reason = None
            else:
                reason = judge.full(entry)
            if reason is None:
                picked = did in picks
                key = int(picked)  # 0 or 1: never an object's id
            else:
                picked, key = False, id(reason)
            verdict = made.get(key)
            if verdict is None:
                verdict = made[key] = DeviceVerdict(driver, pool, name, picked, reason, where)
            append(verdict)
    out = []
    for (ri, si), judge in judges.items():
        rd = judge.rd
        if fits:
            sel = search.selected.get(ri, 0)
            status = "allocated" if si == sel else ("skipped" if si > sel else "unsatisfied")
        else:
            status = "unsatisfied"
        if judge.error:
            status = "error"
        out.append(RequestReport(rd.req.name, rd.req.device_class, rd.req.mode, rd.num,
                                 tuple(chosen.get((ri, si), [])), tuple(judge.verdicts),
                                 status))
    return out
