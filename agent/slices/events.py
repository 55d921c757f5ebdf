"""What the watchers tell the controller (``watch.Sink``): which pools to sync, and when.

Repair is fast on purpose: an event from someone else (a kubelet wiping the node's slices, a
person deleting or editing one) schedules the pool ``event_delay_s`` later, to fold a burst
of events into one sync. Upstream waits 30 s there. Our own writes never schedule anything:
the store already holds their answer, so their watch echo is old news.

``Events`` holds the pools waiting for the worker, each with the time it is due, under one
condition that also guards the controller's desired state (controller.py), so a new desired
state and the pools it makes due change together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from agent.common.metrics import Metrics
from agent.slices.api import ApiError
from agent.slices.watch import Scope

__all__ = ["Events"]

log = logging.getLogger("agent.slices")


class Events:
    """The pending pools and the watches' state; every method takes ``cond`` itself."""

    def __init__(
        self,
        pools: Iterable[str],
        desired_pools: Callable[[], Iterable[str]],
        *,
        burst_max_s: float,
        metrics: Metrics,
        report: Callable[[Exception], None],
    ) -> None:
        self._desired_pools = desired_pools  # called with cond held
        self._burst_max_s = burst_max_s
        self._metrics = metrics
        self._report = report
        #: Guards everything here and the controller's desired state (reentrant).
        self.cond = threading.Condition()
        #: Set once the API server holds exactly the desired state; cleared by new work.
        self.in_sync = threading.Event()
        #: Pool -> when it is due; the worker takes due pools off (``take_due``).
        self.pending: dict[str, float] = dict.fromkeys(pools, 0.0)
        self._bursts: dict[str, float] = {}  # pool -> first event of a burst being debounced
        self._recovered = False  # set by a watcher when the server answers again
        self._watch_errors: set[tuple[str, int]] = set()
        self._watch_down: set[str] = set()  # scopes whose server did not answer (guarded)

    # -- watch.Sink -------------------------------------------------------------------------

    def schedule(self, pools: Iterable[str], delay: float) -> None:
        """Sync ``pools`` now (delay 0) or once a burst of foreign changes has settled.

        A burst (a kubelet's deletecollection: one event per slice) is debounced: each event
        pushes the sync ``delay`` further, but never past ``burst_max_s`` after the burst's
        first event. Syncing in the middle of it would plan on a half-deleted pool.
        """
        pools = list(pools)
        if not pools:
            return
        with self.cond:
            now = time.monotonic()
            for pool in pools:
                if delay <= 0:
                    self.pending[pool] = now
                    self._bursts.pop(pool, None)
                    continue
                start = self._bursts.setdefault(pool, now)
                due = min(now + delay, start + self._burst_max_s)
                current = self.pending.get(pool)
                if current is not None and current < start:
                    due = min(current, due)  # an earlier, non-burst sync is kept
                self.pending[pool] = due
            self.in_sync.clear()
            self.cond.notify_all()

    def scope_listed(self, scope: Scope, first: bool) -> None:
        # After a scope's first list, and after each resync list, every pool gets a look;
        # with no pool at all the worker still has to wake up to say "in sync".
        with self.cond:
            pools = set(self._desired_pools()) | scope.store.pools()
            self.cond.notify_all()
        self.schedule(pools, 0.0)

    def watch_failed(self, scope: Scope, error: ApiError, retry_in_s: float) -> None:
        self._metrics.slice_errors.labels(reason="watch").inc()
        fields = {"selector": scope.field_selector, "error": str(error),
                  "retry_in_s": round(retry_in_s, 2)}
        # An unreachable server is said once per outage (watch_recovered ends it), not on
        # every retry of every watch.
        with self.cond:
            first = error.status != 0 or scope.field_selector not in self._watch_down
            if error.status == 0:
                self._watch_down.add(scope.field_selector)
        if first:
            log.warning("watching ResourceSlices failed", extra=fields)
        else:
            log.debug("watching ResourceSlices failed", extra=fields)
        # Outages are expected and retried quietly; a refusal (403 from RBAC or the node
        # authorizer, 400) needs an operator, so it goes to on_error, once per kind.
        key = (scope.field_selector, error.status)
        if not error.transient and key not in self._watch_errors:
            self._watch_errors.add(key)
            self._report(error)

    def watch_recovered(self, scope: Scope) -> None:
        log.info("watching ResourceSlices again", extra={"selector": scope.field_selector})
        with self.cond:
            self._watch_down.discard(scope.field_selector)
            now = time.monotonic()
            # Pools waiting in back-off are retried now, from the shortest delay again.
            for pool, due in self.pending.items():
                self.pending[pool] = min(due, now)
            self._recovered = True
            self.cond.notify_all()

    # -- the controller's side --------------------------------------------------------------

    def due_now(self, pools: Iterable[str]) -> None:
        """A new desired state: each of ``pools`` is due at once (a burst stays a burst)."""
        with self.cond:
            now = time.monotonic()
            for pool in pools:
                self.pending[pool] = now
            self.in_sync.clear()
            self.cond.notify_all()

    def retry_later(self, pool: str, delay: float) -> None:
        with self.cond:
            due = time.monotonic() + delay
            self.pending[pool] = min(self.pending.get(pool, due), due)
            self.in_sync.clear()
            self.cond.notify_all()

    def due_by(self, pools: Iterable[str], now: float) -> None:
        """Each of ``pools`` is due at ``now`` at the latest (the caller holds cond)."""
        for pool in pools:
            self.pending[pool] = min(self.pending.get(pool, now), now)

    def take_recovered(self) -> bool:
        """Whether a watcher saw the server answer again since the last call (cond held)."""
        recovered, self._recovered = self._recovered, False
        return recovered

    def take_due(self, ready: Callable[[str], bool], now: float) -> tuple[list[str], list[float]]:
        """The pools due at ``now`` whose scope is ``ready``, taken off, in order; and when
        the ready ones left are due (the caller holds cond)."""
        waiting = {p: t for p, t in self.pending.items() if ready(p)}
        due = sorted(p for p, t in waiting.items() if t <= now)
        for pool in due:
            del self.pending[pool]
            self._bursts.pop(pool, None)
        return due, list(waiting.values())
