"""Executing one pool's plan against the API server, keeping the local store in step.

Every answer to our own write goes into the store at once; that is what hides watch lag
(the next sync sees the slice just created, not an empty pool). Conflicts re-read the slice
and ask the caller to plan again; a 422 becomes one RejectedSliceError; fields the server
dropped are remembered so the pool is not rewritten forever.

Deliberate difference from upstream (which writes one slice after the other): a pool's
creates after its first are sent ``CREATE_CONCURRENCY`` at a time. Each is an independent
POST with a generated name, all at the pool's one new generation, so the server stores the
same slices whatever order they arrive in, and consumers ignore the pool until every slice
of that generation is there either way; the requests are the same ones. A 2,048-device pool
(16 creates) is published in a third of the time, most of which is the server's. The first
create goes alone: a pool the server refuses, or a server that fails, costs one request as
upstream's. A failure among the later ones stops those not sent yet; the answers of those in
flight are recorded like any other, and the error is the one of the lowest slice index.
test_publish.py::test_creates_after_the_first_are_sent_concurrently
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from agent.common.metrics import Metrics
from agent.slices.api import ApiError, SliceClient
from agent.slices.compare import dropped_fields, likely_gates
from agent.slices.errors import DroppedFieldsError, RejectedSliceError
from agent.slices.pools import AcceptedContent, PoolState
from agent.slices.sync import Create, PoolPlan, SliceContent, Update
from agent.slices.watch import Scope

log = logging.getLogger("agent.slices")

#: Creates of one pool in flight at once, after its first (the lean transport keeps four
#: connections per server: these and the worker's next request reuse them).
CREATE_CONCURRENCY = 4


class ConflictError(Exception):
    """The plan rested on stale data; the store was refreshed, plan again."""


class Publisher:
    """Runs plans; one instance per controller, used by the worker thread only."""

    def __init__(
        self,
        client: SliceClient,
        version: str,
        scope_for_node: Callable[[str | None], Scope | None],
        scope_holding: Callable[[str, str], Scope | None],
        *,
        metrics: Metrics,
        report: Callable[[Exception], None],
    ) -> None:
        self._client = client
        self._version = version
        self._scope_for_node = scope_for_node
        self._scope_holding = scope_holding
        self._metrics = metrics
        self._report = report
        #: Server-accepted content for slices whose fields were dropped (see pools.effective).
        self.accepted: AcceptedContent = {}

    def execute(self, plan: PoolPlan, state: PoolState | None) -> None:
        """Deletes, then updates, then creates; raises ConflictError to ask for a new plan."""
        for delete in plan.deletes:
            self._delete(plan.pool, delete.name, delete.uid, delete.resource_version,
                         delete.reason)
        for update in plan.updates:
            self._written(plan, state, update, self._send(plan, update))
        creates = plan.creates
        if not creates:
            return
        self._written(plan, state, creates[0], self._send(plan, creates[0]))
        if len(creates) > 1:
            self._create_concurrently(plan, state, creates[1:])

    def _send(self, plan: PoolPlan, op: Update | Create) -> dict[str, Any]:
        """One write; its ApiError is turned into what it means for the plan (raised)."""
        try:
            if isinstance(op, Create):
                return self._client.create(self._version, op.obj)
            return self._client.update(self._version, op.obj)
        except ApiError as err:
            raise self._failure(plan, op, err) from err

    def _create_concurrently(
        self, plan: PoolPlan, state: PoolState | None, creates: Sequence[Create]
    ) -> None:
        """``creates`` at most CREATE_CONCURRENCY at a time; every answer is recorded, then
        the error of the lowest index, if any, is raised (see the module's docstring)."""
        workers = min(CREATE_CONCURRENCY, len(creates))
        with ThreadPoolExecutor(workers, thread_name_prefix="slices-create") as pool:
            futures = [pool.submit(self._client.create, self._version, op.obj)
                       for op in creates]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()  # not sent yet; those already sending are answered
        first: tuple[BaseException, BaseException] | None = None  # (to raise, its cause)
        for op, future in zip(creates, futures, strict=True):
            if future.cancelled():
                continue
            err = future.exception()
            if err is None:
                self._written(plan, state, op, future.result())
            elif first is None:
                first = (self._failure(plan, op, err) if isinstance(err, ApiError) else err,
                         err)
            elif isinstance(err, ApiError):
                self._count("create", err)
        if first is not None:
            raised, cause = first
            if raised is cause:
                raise raised
            raise raised from cause

    def _failure(self, plan: PoolPlan, op: Update | Create, err: ApiError) -> Exception:
        """What a failed write means: RejectedSliceError (422), ConflictError (plan again)
        or the ApiError itself (back off)."""
        verb = "create" if isinstance(op, Create) else "update"
        self._count(verb, err)
        if err.invalid:
            return RejectedSliceError(plan.pool, op.index, _name_of(op), err)
        if err.conflict or err.not_found:
            # Update: someone changed or deleted it. Create: a generated name
            # collided 8 times. Either way: look again, plan again.
            if verb == "update":
                self._refresh(_name_of(op), self._scope_of(op))
            return ConflictError()
        return err

    def _written(
        self, plan: PoolPlan, state: PoolState | None, op: Update | Create,
        stored: dict[str, Any],
    ) -> None:
        """Record the server's answer to one write of ``plan``."""
        verb = "create" if isinstance(op, Create) else "update"
        self._count(verb, None)
        scope = self._scope_of(op)
        if scope is not None:
            scope.store.written(stored)
        log.info(f"{verb}d ResourceSlice", extra={
            "pool": plan.pool, "slice": stored.get("metadata", {}).get("name"),
            "generation": plan.generation,
        })
        if state is not None:
            self._check_dropped(plan.pool, op.index, op.obj, stored, state)

    def _scope_of(self, op: Update | Create) -> Scope | None:
        node = op.obj.get("spec", {}).get("nodeName")
        return self._scope_for_node(node if isinstance(node, str) else None)

    def _delete(
        self, pool: str, name: str, uid: str | None, rv: str | None, reason: str
    ) -> None:
        scope = self._scope_holding(pool, name)
        try:
            deleted_rv = self._client.delete(self._version, name, uid, rv)
        except ApiError as err:
            self._count("delete", err)
            if err.not_found:  # already gone: exactly what we wanted
                if scope is not None:
                    scope.store.forget(name)
                return
            if err.conflict:  # changed since we looked (uid/resourceVersion precondition)
                self._refresh(name, scope)
                raise ConflictError from err
            raise
        self._count("delete", None)
        if scope is not None:
            scope.store.deleted(name, _int(deleted_rv))
        log.info("deleted ResourceSlice", extra={"pool": pool, "slice": name, "reason": reason})

    def _refresh(self, name: str, scope: Scope | None) -> None:
        """Re-read one slice after a conflict so the next plan starts from the truth."""
        fresh = self._client.get(self._version, name)
        if scope is None:
            return
        if fresh is None:
            scope.store.forget(name)
        else:
            scope.store.written(fresh)

    def _check_dropped(
        self, pool: str, index: int, sent: Mapping[str, Any], stored: Mapping[str, Any],
        state: PoolState,
    ) -> None:
        paths = dropped_fields(sent.get("spec", {}), stored.get("spec", {}))
        if not paths or index >= len(state.slice_fingerprints):
            return
        key = (pool, index, state.slice_fingerprints[index])
        if key in self.accepted:
            return
        spec = stored.get("spec", {})
        # From now on the stored form is what "in sync" means for this content: no loop,
        # and the error is reported once per content, not once per sync.
        self.accepted[key] = SliceContent(
            tuple(spec.get("devices") or ()), tuple(spec.get("sharedCounters") or ())
        )
        err = DroppedFieldsError(
            pool, index, str(stored.get("metadata", {}).get("name")), paths, likely_gates(paths)
        )
        self._metrics.slice_errors.labels(reason="dropped_fields").inc()
        log.warning(str(err), extra={"pool": pool})
        self._report(err)

    def _count(self, verb: str, err: ApiError | None) -> None:
        if err is None:
            result = "ok"
        elif err.conflict:
            result = "conflict"
        elif err.not_found:
            result = "not_found"
        elif err.invalid:
            result = "invalid"
        else:
            result = "error"
        self._metrics.slice_writes.labels(verb=verb, result=result).inc()


def _name_of(op: Update | Create) -> str:
    meta = op.obj.get("metadata", {})
    return str(meta.get("name") or meta.get("generateName", ""))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
