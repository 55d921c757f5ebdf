"""Executing one pool's plan against the API server, keeping the local store in step.

Every answer to our own write goes into the store at once; that is what hides watch lag
(the next sync sees the slice just created, not an empty pool). Conflicts re-read the slice
and ask the caller to plan again; a 422 becomes one RejectedSliceError; fields the server
dropped are remembered so the pool is not rewritten forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.common.metrics import Metrics
from agent.slices.api import ApiError, SliceClient
from agent.slices.compare import dropped_fields, likely_gates
from agent.slices.errors import DroppedFieldsError, RejectedSliceError
from agent.slices.pools import AcceptedContent, PoolState
from agent.slices.sync import Create, PoolPlan, SliceContent, Update
from agent.slices.watch import Scope

log = logging.getLogger("agent.slices")


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
        ops: list[Update | Create] = [*plan.updates, *plan.creates]
        for op in ops:
            verb = "create" if isinstance(op, Create) else "update"
            meta = op.obj.get("metadata", {})
            name = meta.get("name") or meta.get("generateName", "")
            node = op.obj.get("spec", {}).get("nodeName")
            scope = self._scope_for_node(node if isinstance(node, str) else None)
            try:
                if verb == "create":
                    stored = self._client.create(self._version, op.obj)
                else:
                    stored = self._client.update(self._version, op.obj)
            except ApiError as err:
                self._count(verb, err)
                if err.invalid:
                    raise RejectedSliceError(plan.pool, op.index, name, err) from err
                if err.conflict or err.not_found:
                    # Update: someone changed or deleted it. Create: a generated name
                    # collided 8 times. Either way: look again, plan again.
                    if verb == "update":
                        self._refresh(name, scope)
                    raise ConflictError from err
                raise
            self._count(verb, None)
            if scope is not None:
                scope.store.written(stored)
            log.info(f"{verb}d ResourceSlice", extra={
                "pool": plan.pool, "slice": stored.get("metadata", {}).get("name"),
                "generation": plan.generation,
            })
            if state is not None:
                self._check_dropped(plan.pool, op.index, op.obj, stored, state)

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


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
