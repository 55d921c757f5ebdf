"""The scheduler's structured-parameters search for one claim on one node, with reasons.

Same order as upstream (k8s.io/dynamic-resource-allocation/structured): requests in claim order,
``firstAvailable`` alternatives in order, devices in pool order (driver, pool name), slice name,
then position in the slice; depth-first with backtracking; the first complete solution wins.
Within one request only combinations are tried (never permutations), so the devices of a
request come out in search order. Differences: counters taken for a device that is then refused
(taint, constraint) are given back, and distinctAttribute compares with every chosen device.

The search's data model is in ``agent.explain.candidates``; the checks of one request against
one device that need no search state (capacity, taints) are in ``agent.explain.matching``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from agent.explain.candidates import Entry, ReqData, Result
from agent.explain.cel_env import CelEnv
from agent.explain.cel_lib import SelectorRuntimeError
from agent.explain.constraints import Tracker
from agent.explain.devices import Device
from agent.explain.features import Release
from agent.explain.matching import capacity_check, consumed_capacity, taint_reason
from agent.explain.model import MAX_RESULTS, Claim, DeviceID
from agent.explain.pools import AllocatedState, Node, PoolView, available_counters, node_matches
from agent.explain.reasons import (
    ALLOCATED,
    COUNTERS,
    IN_CLAIM,
    NODE,
    SELECTOR,
    SELECTOR_ERROR,
    Reason,
)
from agent.explain.values import format_quantity

_UNSET = object()


class TooManyDevicesError(Exception):
    """More than 32 results would be needed: prune like upstream, try fewer-device options."""


#: The scheduler's Filter gives up a node's allocation after this long (DRASchedulerFilterTimeout,
#: on by default since 1.34; the DynamicResources plugin's ``filterTimeout``, 10 s) and the node
#: is unschedulable for the pod. Identical devices a claim asks for more of than fit (64 VFs, a
#: link for 4) make the search combinatorial in both allocators.
FILTER_TIMEOUT_S = 10.0
#: Devices considered between two looks at the clock (a look costs about what one does).
_CLOCK_EVERY = 4096


class SearchAbortedError(Exception):
    """The scheduler would stop with an error (runtime CEL error, constraint vs. All mode,
    its filter timeout)."""

    def __init__(self, message: str, key: tuple[int, int] | None = None,
                 device: DeviceID | None = None, reason: Reason | None = None) -> None:
        super().__init__(message)
        self.origin: object = None  # the Search (claim) that raised it
        self.key = key
        self.device = device
        self.reason = reason


@dataclass
class Search:
    """One Allocate call for one claim; ``run()`` returns whether a solution was found."""

    claim: Claim
    node: Node
    pools: list[PoolView]
    entries: list[Entry]
    data: dict[tuple[int, int], ReqData]
    state: AllocatedState
    env: CelEnv
    trackers: list[Tracker]
    results: list[Result] = field(default_factory=list)
    selected: dict[int, int] = field(default_factory=dict)  # request -> chosen alternative
    allocating: dict[DeviceID, str] = field(default_factory=dict)  # device -> request name
    allocating_capacity: dict[DeviceID, dict[str, Fraction]] = field(default_factory=dict)
    consumed_counters: dict[str, dict[str, dict[str, Fraction]]] = field(default_factory=dict)
    available: dict[str, dict[str, dict[str, Fraction]]] = field(default_factory=dict)
    dynamic: dict[tuple[int, int], dict[DeviceID, Reason]] = field(default_factory=dict)
    steps: int = 0
    # (request, CEL view of the device) -> selector verdict; runtime errors are not cached
    selector_reasons: dict[tuple[tuple[int, int], int], object] = field(default_factory=dict)
    share_ids: Callable[[], str] = field(default=lambda: str(uuid.uuid4()))
    release: Release = field(default_factory=Release)
    # Several claims of one pod: ``then`` searches the next claim once this one is complete
    # (the dicts above are shared with it); ``own`` is what this claim takes, which is all that
    # admin access must not take twice; ``prefix`` names the claim in reasons.
    then: Callable[[], bool] | None = None
    own: set[DeviceID] = field(default_factory=set)
    prefix: str = ""
    #: ``(clock, deadline, timeout_s)``: the search gives up, as the scheduler's filter does,
    #: once ``clock()`` passes ``deadline``; None searches to the end.
    deadline: tuple[Callable[[], float], float, float] | None = None
    considered: int = 0  # devices looked at, for the deadline

    # --- checks shared with the report ----------------------------------------------------

    def selectable(self, rd: ReqData, entry: Entry) -> Reason | None:
        """Class selectors, then request selectors, then per-device node selection."""
        device = entry.device
        view = (rd.key, self.env.view(device))
        reason = self.selector_reasons.get(view, _UNSET)
        if reason is _UNSET:
            reason = self.selector_reasons[view] = self._selectors(rd, device)
        if reason is None and entry.per_device and not node_matches(
                self.node, device.node_name, device.all_nodes, device.node_selector):
            return Reason(NODE, f"not available on node {self.node.name}")
        return reason if isinstance(reason, Reason) else None

    def _selectors(self, rd: ReqData, device: Device) -> Reason | None:
        for cs in rd.class_selectors + rd.selectors:
            try:
                ok = self.env.matches(cs, device)
            except SelectorRuntimeError as err:
                raise SearchAbortedError(str(err), rd.key, device.id, Reason(
                    SELECTOR_ERROR, f"{cs.selector.owner} selector #{cs.selector.index}: "
                    f"{err.cause}", {"expression": cs.selector.expression})) from None
            if not ok:
                part = self.env.failing_part(cs, device)
                return Reason(SELECTOR, f"{cs.selector.owner} selector #{cs.selector.index} is "
                              f"false: {part}",
                              {"owner": cs.selector.owner, "index": cs.selector.index,
                               "expression": cs.selector.expression, "failing": part})
        return None

    def in_use(self, rd: ReqData, did: DeviceID, allow_multiple: bool) -> Reason | None:
        if rd.req.admin_access:
            if not allow_multiple and did in self.own:
                return Reason(IN_CLAIM, f"already chosen for request {self.allocating[did]}",
                              {"request": self.allocating[did]})
            return None
        holder = self.state.devices.get(did)
        if holder is not None:
            return Reason(ALLOCATED, f"allocated to claim {holder}", {"claim": holder})
        if did in self.allocating:
            return Reason(IN_CLAIM, f"already chosen for request {self.allocating[did]}",
                          {"request": self.allocating[did]})
        return None

    def capacity(self, rd: ReqData, device: Device) -> Reason | None:
        return capacity_check(rd.req, device, self.state.capacity.get(device.id),
                              self.allocating_capacity.get(device.id))

    def counters(self, entry: Entry, commit: bool) -> Reason | None:
        """Whether the device's counters still fit; with ``commit`` they are taken."""
        pool = entry.pool
        avail = self.available.get(pool.id)
        if avail is None:
            avail = self.available[pool.id] = available_counters(pool, self.state)
        used = self.consumed_counters.setdefault(pool.id, {})
        for set_name, counters in entry.device.consumes:
            for cname, value in counters.items():
                have = avail.get(set_name, {}).get(cname, Fraction(0))
                taken = used.get(set_name, {}).get(cname, Fraction(0))
                if taken + value > have:
                    left = max(have - taken, Fraction(0))
                    holders = self._holders(pool, set_name, cname)
                    by = f" (taken by {', '.join(holders)})" if holders else ""
                    return Reason(COUNTERS, f"counter {set_name}/{cname}: needs "
                                  f"{format_quantity(value)}, {format_quantity(left)} left{by}",
                                  {"counterSet": set_name, "counter": cname,
                                   "needed": format_quantity(value),
                                   "left": format_quantity(left), "takenBy": holders})
        # Upstream then checks every counter set of the pool, not only the device's: a set
        # already overdrawn by allocated devices (a driver shrank it) refuses every device
        # that consumes counters in the pool.
        for set_name, have_counters in avail.items():
            for cname, have in have_counters.items():
                taken = used.get(set_name, {}).get(cname, Fraction(0))
                if have < taken:
                    return Reason(COUNTERS, f"counter {set_name}/{cname} of the pool is "
                                  f"overdrawn ({format_quantity(have - taken)} left)",
                                  {"counterSet": set_name, "counter": cname,
                                   "left": format_quantity(have - taken)})
        if commit:
            self._add_counters(entry, 1)
        return None

    def _holders(self, pool: PoolView, set_name: str, counter: str) -> list[str]:
        """The devices (allocated, or chosen for this claim) that consume ``counter``: the
        partitions a refused one overlaps (``gpu-2-mig-3g40gb-4`` holds memory-slice-4)."""
        return sorted(d.name for d in pool.all_devices
                      if (self.state.holds(d.id) or d.id in self.allocating)
                      and any(s == set_name and counter in c for s, c in d.consumes))

    def _add_counters(self, entry: Entry, sign: int) -> None:
        used = self.consumed_counters.setdefault(entry.pool.id, {})
        for set_name, counters in entry.device.consumes:
            cset = used.setdefault(set_name, {})
            for cname, value in counters.items():
                cset[cname] = cset.get(cname, Fraction(0)) + sign * value

    # --- the search -----------------------------------------------------------------------

    def _note(self, rd: ReqData, did: DeviceID, reason: Reason) -> None:
        self.dynamic.setdefault(rd.key, {}).setdefault(did, reason)

    def allocate_device(self, rd: ReqData, entry: Entry, must: bool) -> Callable[[], None] | None:
        """Take the device for the request, or None (reason noted). Returns the undo."""
        req, device = rd.req, entry.device
        did = entry.did
        multi = device.allow_multiple
        reason = self.in_use(rd, did, multi)
        if reason is not None:
            self._note(rd, did, reason)
            return None
        if entry.counters_off:
            self._note(rd, did, Reason(COUNTERS, "consumes counters, but the "
                                       "DRAPartitionableDevices feature is off"))
            return None
        took_counters = False
        if device.consumes and not (multi and self._capacity_in_use(did)):
            reason = self.counters(entry, commit=True)
            if reason is not None:
                self._note(rd, did, reason)
                return None
            took_counters = True
        reason = taint_reason(req, device) if device.taints else None
        added: list[Tracker] = []
        if reason is None:
            for t in self.trackers:
                reason = t.check(req.base, req.sub, device)
                if reason is not None:
                    if must:
                        raise SearchAbortedError(
                            f"request {req.name}: cannot add device {device.name} because a "
                            f"claim constraint would not be satisfied ({reason.message})",
                            rd.key, did, reason)
                    break
                t.add(req.base, req.sub, device)
                added.append(t)
        if reason is None:
            reason = self.capacity(rd, device)
        if reason is not None:
            for t in added:
                t.remove(req.base, req.sub, device)
            if took_counters:
                self._add_counters(entry, -1)
            self._note(rd, did, reason)
            return None
        # An admin-access request may take a device another claim of the pod already holds;
        # that hold must survive this request's undo, so only a hold we made is undone.
        holds = not multi and did not in self.allocating
        owns = not multi and did not in self.own
        if holds:
            self.allocating[did] = self.prefix + req.name
        if owns:
            self.own.add(did)
        result = Result(req, entry)
        if multi:
            result.consumed = {n: consumed_capacity(req, c, n) for n, c in device.capacity.items()}
            result.share_id = self.share_ids()
            agg = self.allocating_capacity.setdefault(did, {})
            for n, v in result.consumed.items():
                agg[n] = agg.get(n, Fraction(0)) + v
        self.results.append(result)
        size = len(self.results)

        def undo() -> None:
            for t in added:
                t.remove(req.base, req.sub, device)
            if holds:
                self.allocating.pop(did, None)
            if owns:
                self.own.discard(did)
            if result.consumed:
                agg = self.allocating_capacity[did]
                for n, v in result.consumed.items():
                    agg[n] -= v
                if all(v == 0 for v in agg.values()):
                    del self.allocating_capacity[did]
            if took_counters:
                self._add_counters(entry, -1)
            del self.results[size - 1:]

        return undo

    def _capacity_in_use(self, did: DeviceID) -> bool:
        return did in self.state.capacity or did in self.allocating_capacity

    def _check_deadline(self, deadline: tuple[Callable[[], float], float, float]) -> None:
        clock, at, timeout_s = deadline
        if clock() > at:
            raise SearchAbortedError(
                f"timed out after {timeout_s:g}s: the scheduler's filter gives up this search "
                f"then and the node is unschedulable for the pod ({self.steps:,} partial "
                "allocations tried; a claim asking for more identical devices than fit "
                "tries every combination)")

    def run(self) -> bool:
        """Search this claim (and, through ``then``, the pod's later claims)."""
        try:
            return self._one(0, 0, 0, False, 0)
        except TooManyDevicesError:
            # Too many devices for this claim is no error of the pod: an earlier claim's other
            # choice may let a firstAvailable of this one ask for fewer (as upstream).
            return False
        except SearchAbortedError as err:
            if err.origin is None:
                err.origin = self
            raise

    def _one(self, ri: int, si: int, di: int, in_sub: bool, start: int) -> bool:
        self.steps += 1
        if ri >= len(self.claim.requests):
            return True if self.then is None else self.then()
        creq = self.claim.requests[ri]
        if not in_sub and creq.prioritized:
            all_too_many = True
            for j in range(len(creq.alternatives)):
                try:
                    ok = self._one(ri, j, 0, True, 0)
                except TooManyDevicesError:
                    continue
                all_too_many = False
                if ok:
                    self.selected[ri] = j
                    return True
            if all_too_many:
                raise TooManyDevicesError()
            return False
        rd = self.data[(ri, si)]
        if rd.all_devices is not None and not rd.all_devices:
            return False
        if di >= rd.num:
            return self._one(ri + 1, 0, 0, False, 0)
        if len(self.results) + rd.num - di > MAX_RESULTS:
            raise TooManyDevicesError()
        if rd.all_devices is not None:
            undo = self.allocate_device(rd, rd.all_devices[di], must=True)
            if undo is None:
                return False
            # 1.35 goes on with subrequest 0 here (see Release.all_keeps_subrequest)
            nsi = si if self.release.all_keeps_subrequest else 0
            try:
                if self._one(ri, nsi, di + 1, in_sub, 0):
                    return True
            except BaseException:
                undo()
                raise
            undo()
            return False
        # The loop below runs for every device of every request tried: what it reads is
        # looked up once here.
        admin = rd.req.admin_access
        own, allocating, held = self.own, self.allocating, self.state.devices
        used_capacity, allocating_capacity = self.state.capacity, self.allocating_capacity
        wants_capacity = bool(rd.req.capacity)
        deadline = self.deadline
        for entry in self.entries[start:]:
            self.considered += 1
            if deadline is not None and self.considered % _CLOCK_EVERY == 0:
                self._check_deadline(deadline)
            did = entry.did
            # "In use" is cheap, so upstream checks it before the selectors.
            if did in own if admin else did in allocating or did in held:
                continue
            if self.selectable(rd, entry) is not None:
                continue
            # capacity_check is None without a capacity request or any of it in use
            if (wants_capacity or did in used_capacity or did in allocating_capacity) and \
                    self.capacity(rd, entry.device) is not None:
                continue
            undo = self.allocate_device(rd, entry, must=False)
            if undo is None:
                continue
            try:
                if self._one(ri, si, di + 1, in_sub, entry.index + 1):
                    return True
            except BaseException:
                undo()
                raise
            undo()
        return False
