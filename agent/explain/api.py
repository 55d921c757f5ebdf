"""``explain()``: would this claim fit on this node, which devices, and why (not).

The orchestration: parse the input into the model, build one ``Search`` per claim of the pod
(``agent.explain.allocator``), refuse what upstream's Allocate refuses before it searches, run
the search, then report each device's verdict (``agent.explain.verdicts``) and, for a claim
that fits, its allocation (``agent.explain.allocation``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from agent.explain.allocation import allocation_of
from agent.explain.allocator import FILTER_TIMEOUT_S, Search, SearchAbortedError
from agent.explain.candidates import request_data, search_order
from agent.explain.cel_env import CelEnv
from agent.explain.constraints import Tracker
from agent.explain.devices import AllocatedDevice, parse_allocated, parse_slice
from agent.explain.docs import Doc, InputError, from_object
from agent.explain.features import (
    MODELLED_KUBERNETES,
    Features,
    capacity_requests_refused,
    channel,
    distinct_supported,
    release,
    resolve,
)
from agent.explain.matching import capacity_check
from agent.explain.model import ALL, MAX_RESULTS, Claim, parse_claim, parse_class
from agent.explain.pools import AllocatedState, Node, gather_pools
from agent.explain.result import ExplainResult, PodExplainResult, PoolReport
from agent.explain.suggest import suggest
from agent.explain.verdicts import request_reports


def _doc(obj: Mapping[str, Any] | Doc, what: str) -> Doc:
    return obj if isinstance(obj, Doc) else from_object(obj, what)


def _gate_errors(claim: Claim, features: Features, version: str) -> None:
    """What upstream's Allocate refuses up front when a gate is off (an error, not a fit)."""
    for i, con in enumerate(claim.constraints):
        if con.distinct_attribute and not distinct_supported(features, version):
            raise SearchAbortedError(f"constraint #{i}: empty constraint (distinctAttribute is "
                                     f"unknown to the {channel(features, version)} allocator "
                                     "these gates select; it needs DRAConsumableCapacity)")
    for creq in claim.requests:
        if creq.prioritized and not features.prioritized_list:
            raise SearchAbortedError(f"request {creq.name}: has subrequests, but the "
                                     "DRAPrioritizedList feature is disabled")
        for req in creq.alternatives:
            if (req.capacity and not features.consumable_capacity
                    and capacity_requests_refused(features, version)):
                raise SearchAbortedError(f"request {req.name}: has capacity requests, but the "
                                         "DRAConsumableCapacity feature is disabled")
            if req.admin_access and not features.admin_access:
                raise SearchAbortedError(f"request {req.name}: admin access is requested, but "
                                         "the DRAAdminAccess feature is disabled")


def explain(
    claim: Mapping[str, Any] | Doc,
    classes: Sequence[Mapping[str, Any] | Doc],
    slices: Sequence[Mapping[str, Any] | Doc],
    node_name: str,
    allocated: Sequence[Mapping[str, Any] | Doc] = (),
    *,
    node_labels: Mapping[str, str] | None = None,
    share_ids: Callable[[], str] | None = None,
    feature_gates: Features | Mapping[str, bool] | str | None = None,
    kubernetes_version: str = MODELLED_KUBERNETES,
    timeout_s: float | None = FILTER_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> ExplainResult:
    """Replay the scheduler's Filter decision for one claim on one node.

    ``allocated`` are other ResourceClaims (only their ``status.allocation`` matters); the claim
    itself is skipped if it is among them. Raises InputError for input the API server or the
    scheduler would reject (unknown fields, CEL that does not compile, unknown classes).
    ``feature_gates`` override ``kubernetes_version``'s defaults (see agent.explain.features).
    ``timeout_s``: the scheduler's filter timeout (None: search to the end), on ``clock``.
    """
    return explain_pod([claim], classes, slices, node_name, allocated, node_labels=node_labels,
                       share_ids=share_ids, feature_gates=feature_gates,
                       kubernetes_version=kubernetes_version, timeout_s=timeout_s,
                       clock=clock).claims[0]


def explain_pod(
    claims: Sequence[Mapping[str, Any] | Doc],
    classes: Sequence[Mapping[str, Any] | Doc],
    slices: Sequence[Mapping[str, Any] | Doc],
    node_name: str,
    allocated: Sequence[Mapping[str, Any] | Doc] = (),
    *,
    node_labels: Mapping[str, str] | None = None,
    share_ids: Callable[[], str] | None = None,
    feature_gates: Features | Mapping[str, bool] | str | None = None,
    kubernetes_version: str = MODELLED_KUBERNETES,
    timeout_s: float | None = FILTER_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> PodExplainResult:
    """``explain`` for all claims of one pod at once, as the scheduler allocates them: one
    search over the claims in order, backtracking into an earlier claim when a later one does
    not fit; a device one claim takes is in use for the next (admin access: within a claim)."""
    with _collector_paused():
        return _explain_pod(claims, classes, slices, node_name, allocated,
                            node_labels=node_labels, share_ids=share_ids,
                            feature_gates=feature_gates, kubernetes_version=kubernetes_version,
                            timeout_s=timeout_s, clock=clock)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic collection while one explain runs: it builds tens of thousands of objects
    that all live until it returns (devices, entries, verdicts) and makes no garbage cycles,
    so each pass the allocations trigger walks them, and the caller's parsed input, and frees
    nothing (a 2,048-device explain: 290 M instructions, about 8% of them the collector's)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _explain_pod(
    claims: Sequence[Mapping[str, Any] | Doc],
    classes: Sequence[Mapping[str, Any] | Doc],
    slices: Sequence[Mapping[str, Any] | Doc],
    node_name: str,
    allocated: Sequence[Mapping[str, Any] | Doc],
    *,
    node_labels: Mapping[str, str] | None,
    share_ids: Callable[[], str] | None,
    feature_gates: Features | Mapping[str, bool] | str | None,
    kubernetes_version: str,
    timeout_s: float | None,
    clock: Callable[[], float],
) -> PodExplainResult:
    t0 = time.perf_counter()
    features = resolve(feature_gates, kubernetes_version)
    behaviour = release(kubernetes_version)
    if not claims:
        raise InputError("claims", "no ResourceClaim to explain")
    parsed = [parse_claim(_doc(x, "claim")) for x in claims]
    class_map = {k.name: k for k in (parse_class(_doc(x, "class")) for x in classes)}
    parsed_slices = [parse_slice(_doc(s, "slice")) for s in slices]
    held: list[AllocatedDevice] = []
    for a in allocated:
        doc = _doc(a, "allocated claim")
        meta = doc.obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}  # parse_allocated says what is wrong
        if not any(_same_claim(c, meta) for c in parsed):
            held.extend(parse_allocated(doc))
    state = AllocatedState.build(held)
    node = Node(node_name, dict(node_labels or {"kubernetes.io/hostname": node_name}))
    t_parsed = time.perf_counter()
    # The scheduler's filter timeout runs from the start of its Filter call: the parsing
    # here is its informer's work, done before.
    deadline = None if timeout_s is None else (clock, clock() + timeout_s, timeout_s)
    pools = gather_pools(parsed_slices, node, partitionable=features.partitionable_devices)
    entries = search_order(pools, features)
    env = CelEnv()
    searches: list[Search] = []
    ignore_capacity = not features.consumable_capacity and not capacity_requests_refused(
        features, kubernetes_version)
    for given in parsed:
        # the allocator these gates select ignores capacity requests
        c = _without_capacity(given) if ignore_capacity else given
        search = Search(c, node, pools, entries, request_data(c, class_map, env), state, env,
                        [Tracker(k, features.list_type_attributes) for k in c.constraints])
        search.release = behaviour
        search.deadline = deadline
        if share_ids is not None:
            search.share_ids = share_ids
        if searches:  # what the pod's claims take so far is shared by all of them
            first = searches[0]
            search.allocating = first.allocating
            search.allocating_capacity = first.allocating_capacity
            search.consumed_counters = first.consumed_counters
            search.available = first.available
            search.prefix = f"{c.namespace}/{c.name} " if len(parsed) > 1 else ""
            searches[-1].then = search.run
        elif len(parsed) > 1:
            search.prefix = f"{c.namespace}/{c.name} "
        searches.append(search)

    errors: list[str | None] = [None] * len(searches)
    fits = False
    try:
        # Every claim is checked before the search starts, as upstream's Allocate does.
        for search in searches:
            try:
                _check_claim(search, features, kubernetes_version)
            except SearchAbortedError as err:
                err.origin = search
                raise
        fits = searches[0].run()
    except SearchAbortedError as err:
        at = next((i for i, s in enumerate(searches) if s is err.origin), 0)
        errors[at] = str(err)
        if err.key is not None and err.device is not None and err.reason is not None:
            searches[at].dynamic.setdefault(err.key, {})[err.device] = err.reason
    t_search = time.perf_counter()

    invalid = any(p.invalid for p in pools)
    pool_reports = tuple(
        PoolReport(p.driver, p.name, p.generation, sum(len(s.devices) for s in p.slices),
                   "incomplete" if p.incomplete else ("invalid" if p.invalid else "ok"),
                   f"{p.seen_slices} of {p.expected_slices} slices at generation "
                   f"{p.generation}" if p.incomplete else p.invalid)
        for p in pools)
    pod_error = next((e for e in errors if e), None)
    if not fits and pod_error is None and invalid:
        pod_error = errors[0] = "invalid resource pools were encountered"
    results = []
    for search, error in zip(searches, errors, strict=True):
        c = search.claim
        reports = request_reports(search, fits)
        allocation = allocation_of(search, class_map) if fits else None
        suggestion = None if fits else suggest(c, reports, pool_reports, search, error)
        t_end = time.perf_counter()
        stats = {
            "devices": float(len(entries)),
            "searchSteps": float(search.steps),
            "celCompiled": float(env.stats.compiled),
            "celCompileMs": env.stats.compile_seconds * 1e3,
            "celEvaluations": float(env.stats.evaluations),
            "celEvalMs": env.stats.eval_seconds * 1e3,
            "celConversions": float(env.stats.conversions),
            "celConvertMs": env.stats.convert_seconds * 1e3,
            "parseMs": (t_parsed - t0) * 1e3,
            "searchMs": (t_search - t_parsed) * 1e3,
            "totalMs": (t_end - t0) * 1e3,
        }
        results.append(ExplainResult(fits, f"{c.namespace}/{c.name}", node_name, allocation,
                                     tuple(reports), pool_reports, suggestion, error, stats))
    return PodExplainResult(fits, node_name, tuple(results), pod_error)


def _check_claim(search: Search, features: Features, version: str) -> None:
    _gate_errors(search.claim, features, version)
    _prepare_all_mode(search)
    c = search.claim
    min_devices = sum(min(search.data[(ri, si)].num for si in range(len(r.alternatives)))
                      for ri, r in enumerate(c.requests))
    if min_devices > MAX_RESULTS:
        raise SearchAbortedError(f"the claim asks for {min_devices} devices; one allocation "
                                 f"holds at most {MAX_RESULTS}")


def _without_capacity(c: Claim) -> Claim:
    return replace(c, requests=tuple(
        replace(r, alternatives=tuple(replace(a, capacity=None) for a in r.alternatives))
        for r in c.requests))


def _same_claim(c: Claim, meta: Mapping[str, Any]) -> bool:
    same_uid = bool(c.uid) and meta.get("uid") == c.uid
    return same_uid or (meta.get("namespace") or "default", meta.get("name")) == (c.namespace,
                                                                                 c.name)


def _prepare_all_mode(search: Search) -> None:
    """``All`` requests: every matching device of every pool, so all pools must be complete."""
    for rd in search.data.values():
        if rd.req.mode != ALL:
            continue
        for pool in search.pools:
            if pool.incomplete:
                raise SearchAbortedError(f"request {rd.req.name}: asks for all devices, but "
                                         f"resource pool {pool.id} is currently being updated")
            if pool.invalid:
                raise SearchAbortedError(f"request {rd.req.name}: asks for all devices, but "
                                         f"resource pool {pool.id} is currently invalid")
        rd.all_devices = [e for e in search.entries
                          if search.selectable(rd, e) is None
                          and capacity_check(rd.req, e.device, search.state.capacity.get(
                              e.device.id), None) is None]
        rd.num = len(rd.all_devices)

