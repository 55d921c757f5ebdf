"""After the search: each request's report, a verdict for every device of the node, picked
or with the reason it was not (``RequestReport``, ``DeviceVerdict``).

A reason that needs no search state (selectors, held by another claim, capacity, counters,
taints) is the same whatever the search did; the rest is judged against the solution found,
or, when none was, taken from what the search noted while it backtracked.
"""

from __future__ import annotations

from agent.explain.allocator import Search, SearchAbortedError
from agent.explain.candidates import Entry, ReqData
from agent.explain.matching import capacity_check, taint_reason
from agent.explain.reasons import ALLOCATED, SELECTOR_ERROR, DeviceVerdict, Reason, RequestReport

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def _location(entry: Entry) -> str:
    found = entry.device.attribute(PCIE_ROOT)
    return str(found[1]) if found else ""


def _static_reason(search: Search, rd: ReqData, entry: Entry) -> Reason | None:
    try:
        reason = search.selectable(rd, entry)
    except SearchAbortedError as err:
        return err.reason
    if reason is not None:
        return reason
    device = entry.device
    holder = search.state.devices.get(device.id)
    if holder is not None and not rd.req.admin_access:
        return Reason(ALLOCATED, f"allocated to claim {holder}", {"claim": holder})
    reason = capacity_check(rd.req, device, search.state.capacity.get(device.id), None)
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
    reason = search.in_use(rd, entry.device.id, entry.device.allow_multiple)
    if reason is None and entry.device.consumes:
        reason = search.counters(entry, commit=False)
    for t in search.trackers:
        if reason is None:
            reason = t.check(rd.req.base, rd.req.sub, entry.device)
    return reason


def request_reports(search: Search, fits: bool) -> list[RequestReport]:
    """One report per request alternative, in claim order."""
    chosen: dict[tuple[int, int], list[str]] = {}
    chosen_ids: dict[tuple[int, int], set[tuple[str, str, str]]] = {}
    for r in search.results:
        ri = next(i for i, cr in enumerate(search.claim.requests) if cr.name == r.req.base)
        si = search.claim.requests[ri].alternatives.index(r.req)
        chosen.setdefault((ri, si), []).append(r.entry.device.name)
        chosen_ids.setdefault((ri, si), set()).add(r.entry.device.id)
    verdicts: dict[tuple[int, int], list[DeviceVerdict]] = {k: [] for k in search.data}
    for entry in search.entries:  # device-major: one CEL binding per device
        d = entry.device
        where = _location(entry)
        for key, rd in search.data.items():
            reason = _static_reason(search, rd, entry)
            picked = d.id in chosen_ids.get(key, set())
            if reason is None and not picked:
                reason = (_final_reason(search, rd, entry) if fits
                          else search.dynamic.get(key, {}).get(d.id))
            verdicts[key].append(DeviceVerdict(d.driver, d.pool, d.name, picked,
                                               None if picked else reason, where))
    out = []
    for (ri, si), rd in search.data.items():
        if fits:
            sel = search.selected.get(ri, 0)
            status = "allocated" if si == sel else ("skipped" if si > sel else "unsatisfied")
        else:
            status = "unsatisfied"
        if any(v.reason and v.reason.code == SELECTOR_ERROR for v in verdicts[(ri, si)]):
            status = "error"
        out.append(RequestReport(rd.req.name, rd.req.device_class, rd.req.mode, rd.num,
                                 tuple(chosen.get((ri, si), [])), tuple(verdicts[(ri, si)]),
                                 status))
    return out
