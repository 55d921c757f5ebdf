"""The embedded ResourceSlice controller: this node's pools in the cluster, always.

Threads, not asyncio (DESIGN.md): one worker that syncs pools one at a time, and one watcher
per watch scope (watch.py). ``update()`` only records the new desired state and wakes the
worker; it never blocks on the network. The worker plans each pool with the pure
``plan_pool`` (sync.py) and has the Publisher (publish.py) execute the plan.

Repair is fast on purpose: an event from someone else (a kubelet wiping the node's slices, a
person deleting or editing one) schedules the pool ``event_delay_s`` later, to fold a burst
of events into one sync. Upstream waits 30 s there. Our own writes never schedule anything:
the store already holds their answer, so their watch echo is old news.

Errors are retried like upstream's rate-limited work queue: a pool whose sync failed is tried
again after an exponential back-off, reset only by success. That includes a 422: the slice
may become acceptable without any change on our side (the server is upgraded, a feature
gate or admission policy changes), so it is not abandoned. A local validation failure is
not retried, as upstream: nothing outside the agent can make that content valid.

Deliberate differences from upstream, each with its reason and a test:

* repair after a foreign change waits ``event_delay_s`` (0.1 s, at most ``burst_max_s``,
  1 s, for a burst) instead of 30 s: a wiped node is allocatable again in about a second.
  test_controller.py::test_kubelet_wipe_is_repaired_from_the_watch
* a 422 is retried at most every ``rejected_retry_max_s`` (300 s) instead of upstream's
  1000 s cap, so a server upgrade that accepts the slice is picked up within five minutes;
  it is reported (``on_error``, one error line) once per pool content, not on every retry.
  test_controller.py::test_rejected_pool_is_retried_with_backoff_until_the_server_accepts_it
* a conflict (409) re-reads the slice and plans again at once, up to ``conflict_retries``
  times, before backing off; upstream backs off on the first one.
  test_controller.py::test_conflicts_and_server_errors_are_retried
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.common.metrics import Metrics
from agent.slices.api import ApiError, SliceClient
from agent.slices.backoff import Backoff
from agent.slices.errors import PublishError, RejectedSliceError
from agent.slices.listattrs import ListForm
from agent.slices.owner import Owner, OwnerUID
from agent.slices.pools import PoolState, effective, to_desired
from agent.slices.publish import ConflictError, Publisher
from agent.slices.scopes import Scopes
from agent.slices.sync import PoolPlan, plan_pool
from agent.slices.validate import PoolValidationError
from agent.slices.versions import NoResourceAPIError, choose_version
from agent.slices.watch import Scope, Watcher
from discovery.model import DriverResources

log = logging.getLogger("agent.slices")


@dataclass(frozen=True, slots=True)
class Timing:
    """Knobs; the defaults are the daemon's, tests shorten some."""

    event_delay_s: float = 0.1  # quiet time after a foreign change before repairing
    burst_max_s: float = 1.0  # a long burst of foreign changes is repaired after this
    watch_timeout_s: int = 300  # server-side end of each watch request
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    rejected_retry_max_s: float = 300.0  # the cap on retrying a pool the server refused (422)
    conflict_retries: int = 5  # re-read-and-plan-again rounds per sync before backing off
    stop_poll_s: float = 0.5  # how often a caller's stop_event is looked at


def unreachable_line(err: ApiError, retry_max_s: float) -> str:
    """The one line an outage gets: which server, why, and how often it is tried again."""
    server = err.server or "(server unknown)"
    reason = err.unreachable or err.reason or "no answer"
    return f"API server {server} unreachable: {reason}; retrying every ≤ {retry_max_s:g} s"


class Controller:
    """Publishes DriverResources as ResourceSlices. Build it with ``start()``."""

    def __init__(
        self,
        client: SliceClient | None,
        driver: str,
        owner: Owner | None,
        resources: DriverResources | None,
        *,
        metrics: Metrics | None = None,
        resync_period_s: float = 600,
        stop_event: threading.Event | None = None,
        on_error: Callable[[Exception], None] | None = None,
        timing: Timing | None = None,
        list_attributes: bool | None = None,
    ) -> None:
        if not driver:
            raise ValueError("a DRA driver name is required")
        if owner is not None and not owner.is_node and not owner.uid:
            raise ValueError(f"owner {owner.kind}/{owner.name} needs a uid (only a Node's is "
                             "looked up)")
        self._client = client
        self._driver = driver
        self._owner = owner
        self._metrics = metrics or Metrics()
        self._resync_period_s = resync_period_s
        self._external_stop = stop_event
        self._on_error = on_error
        self._timing = timing or Timing()
        self._rng = random.Random()
        self._owner_uid = OwnerUID(
            owner, self._node_uid,
            Backoff(self._timing.backoff_initial_s, self._timing.backoff_max_s, rng=self._rng),
        )
        self._stop = threading.Event()
        self._cond = threading.Condition()  # guards _desired, _pending
        self._in_sync = threading.Event()
        self._form = ListForm(list_attributes)  # decided after API discovery, if "auto"
        self._resources = resources
        self._desired = to_desired(self._form.apply(resources), owner)
        self._pending: dict[str, float] = dict.fromkeys(self._desired, 0.0)
        self._bursts: dict[str, float] = {}  # pool -> first event of a burst being debounced
        self._recovered = False  # set by a watcher when the server answers again
        self._watch_errors: set[tuple[str, int]] = set()
        self._watch_down: set[str] = set()  # scopes whose server did not answer (guarded)
        self._scopes = Scopes(driver, owner, self._start_watcher)
        self._scopes_dirty = False
        self._threads: list[threading.Thread] = []
        self._version: str | None = None
        self._publisher: Publisher | None = None
        # Worker-only state.
        self._backoffs: dict[str, Backoff] = {}
        self._failing: set[str] = set()
        self._generations: dict[str, int] = {}  # last generation published per pool
        self._rejected: dict[str, str] = {}  # pool -> fingerprint refused with 422
        self._invalid: dict[str, str] = {}  # pool -> fingerprint failing local checks
        self._next_resync = time.monotonic() + resync_period_s
        self._worked = False
        if client is None:
            log.warning("no API server configured: ResourceSlices are not published",
                        extra={"driver": driver})
            return
        self._spawn(self._run_worker, "slices-worker")

    # -- public API -------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._client is not None

    @property
    def api_version(self) -> str | None:
        return self._version

    @property
    def list_attributes(self) -> bool | None:
        """Whether list-valued attributes are published (None: not decided yet)."""
        return self._form.lists

    def update(self, resources: DriverResources) -> None:
        """Replace the desired state (the controller takes ownership); never blocks."""
        with self._cond:
            old = set(self._desired)
            self._resources = resources
            self._desired = to_desired(self._form.apply(resources), self._owner)
            self._scopes_dirty = True
            now = time.monotonic()
            for pool in old | set(self._desired):
                self._pending[pool] = now
            self._in_sync.clear()
            self._cond.notify_all()

    def alive(self) -> bool:
        """Whether background publishing still runs (the worker thread); True when inactive.

        A crashed worker would leave the cluster's slices stale for ever: the daemon treats
        ``False`` as fatal.
        """
        if self._client is None or self._stop.is_set():
            return True
        return bool(self._threads) and self._threads[0].is_alive()

    def synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the API server to hold exactly the desired state."""
        if self._client is None:
            return False
        return self._in_sync.wait(timeout)

    def stop(self) -> None:
        """Stop all background work and wait for every thread to end."""
        self._halt()
        # The worker is the only thread that starts others: once it has ended, the list of
        # threads is final.
        index = 0
        while index < len(self._threads):
            thread = self._threads[index]
            if thread is not threading.current_thread():
                thread.join()
            index += 1

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
        with self._cond:
            now = time.monotonic()
            for pool in pools:
                if delay <= 0:
                    self._pending[pool] = now
                    self._bursts.pop(pool, None)
                    continue
                start = self._bursts.setdefault(pool, now)
                due = min(now + delay, start + self._timing.burst_max_s)
                current = self._pending.get(pool)
                if current is not None and current < start:
                    due = min(current, due)  # an earlier, non-burst sync is kept
                self._pending[pool] = due
            self._in_sync.clear()
            self._cond.notify_all()

    def _retry_later(self, pool: str, delay: float) -> None:
        with self._cond:
            due = time.monotonic() + delay
            self._pending[pool] = min(self._pending.get(pool, due), due)
            self._in_sync.clear()
            self._cond.notify_all()

    def scope_listed(self, scope: Scope, first: bool) -> None:
        # After a scope's first list, and after each resync list, every pool gets a look;
        # with no pool at all the worker still has to wake up to say "in sync".
        with self._cond:
            pools = set(self._desired) | scope.store.pools()
            self._cond.notify_all()
        self.schedule(pools, 0.0)

    def watch_failed(self, scope: Scope, error: ApiError, retry_in_s: float) -> None:
        self._metrics.slice_errors.labels(reason="watch").inc()
        fields = {"selector": scope.field_selector, "error": str(error),
                  "retry_in_s": round(retry_in_s, 2)}
        # An unreachable server is said once per outage (watch_recovered ends it), not on
        # every retry of every watch.
        with self._cond:
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
        with self._cond:
            self._watch_down.discard(scope.field_selector)
            now = time.monotonic()
            # Pools waiting in back-off are retried now, from the shortest delay again.
            for pool, due in self._pending.items():
                self._pending[pool] = min(due, now)
            self._recovered = True
            self._cond.notify_all()

    # -- threads ----------------------------------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                target()
            except Exception as err:  # a bug must not end publishing silently
                log.exception("ResourceSlice controller thread crashed",
                              extra={"thread_name": name})
                self._report(err)

        if self._stop.is_set():
            return
        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _stopping(self) -> bool:
        if self._external_stop is not None and self._external_stop.is_set():
            self._halt()
        return self._stop.is_set()

    def _halt(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._scopes.interrupt()

    def _report(self, err: Exception) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(err)
        except Exception:  # the handler is the caller's; its failure must not stop us
            log.exception("on_error handler failed")

    def _backoff(self, key: str) -> Backoff:
        if key not in self._backoffs:
            self._backoffs[key] = Backoff(
                self._timing.backoff_initial_s, self._timing.backoff_max_s, rng=self._rng
            )
        return self._backoffs[key]

    # -- worker -----------------------------------------------------------------------------

    def _run_worker(self) -> None:
        if not self._discover():
            return
        while not self._stopping():
            if self._scopes_dirty or not len(self._scopes):
                self._ensure_scopes()
            due = self._take_due()
            if due:
                self._decide_form()
            self._owner_uid.new_batch()  # at most one Node lookup per batch of pools
            for pool in due or ():
                if self._stopping():
                    return
                self._sync_pool(pool)
                self._worked = True

    def _take_due(self) -> list[str] | None:
        """Pools due now; None after waiting (for work, a stop, or the periodic resync)."""
        with self._cond:
            if self._recovered:
                self._recovered = False
                self._backoffs = {k: v for k, v in self._backoffs.items()
                                  if not k.startswith("pool/")}
            now = time.monotonic()
            if now >= self._next_resync:
                self._next_resync = now + self._resync_period_s
                self._resync()
            recheck = self._owner_uid.recheck_at
            if recheck is not None and now >= recheck:
                # Look for the missing Node again: the next sync of any pool does it.
                self._owner_uid.recheck_at = recheck = None
                for pool in self._desired:
                    self._pending[pool] = min(self._pending.get(pool, now), now)
            ready = {p: t for p, t in self._pending.items() if self._ready(p)}
            due = sorted(p for p, t in ready.items() if t <= now)
            if due:
                for pool in due:
                    del self._pending[pool]
                    self._bursts.pop(pool, None)
                return due
            if not self._pending and self._scopes.all_listed():
                self._mark_synced()
            # Pools waiting for their scope's first list are woken by scope_listed().
            wait = min([self._next_resync - now, *(t - now for t in ready.values()),
                        *([recheck - now] if recheck is not None else [])])
            if self._external_stop is not None:
                wait = min(wait, self._timing.stop_poll_s)
            self._cond.wait(max(wait, 0.0))
            return None

    def _mark_synced(self) -> None:
        if self._failing or self._rejected or self._invalid:
            return
        if self._worked or not self._in_sync.is_set():
            self._metrics.last_publish.set(time.time())
            self._worked = False
        self._in_sync.set()

    def _resync(self) -> None:
        """Periodic safety net: list every scope again, then every pool gets a look."""
        self._scopes.interrupt(relist=True)

    def _discover(self) -> bool:
        assert self._client is not None
        backoff = self._backoff("discovery")
        reported = False
        failing, server = "", "-"  # the warning logged for the current failure, if any
        while not self._stopping():
            try:
                self._version = choose_version(self._client.served_versions())
            except NoResourceAPIError as err:
                if not reported:
                    self._report(err)
                    reported = True
                log.error(str(err))
                delay = backoff.next()
            except ApiError as err:
                delay = backoff.next()
                # One line per change of state, not per retry: an outage at start-up would
                # otherwise write a warning every few seconds for as long as it lasts.
                state = unreachable_line(err, self._timing.backoff_max_s) if err.status == 0 \
                    else f"API discovery failed: {err.status} {err.reason}"
                if state != failing:
                    log.warning(state, extra={"server": err.server or "-", "error": str(err)})
                    failing, server = state, err.server or "-"
                else:
                    log.debug("API discovery failed",
                              extra={"error": str(err), "retry_in_s": round(delay, 2)})
            else:
                if failing:
                    log.info("API server answers again", extra={"server": server})
                log.info("publishing ResourceSlices",
                         extra={"api_version": self._version, "driver": self._driver})
                self._publisher = Publisher(
                    self._client, self._version, self._scopes.for_node, self._scopes.holding,
                    metrics=self._metrics, report=self._report,
                )
                return True
            self._stop.wait(delay)
        return False

    def _decide_form(self) -> None:
        """Probe the server (once per start) when a pool first has a list form to offer,
        and re-form the desired pools before any of them is synced in the wrong form."""
        assert self._client is not None and self._version is not None
        with self._cond:
            resources = self._resources
        if not self._form.undecided(resources):
            return
        if self._form.decide(self._client, self._driver, self._owner, self._version):
            with self._cond:
                self._desired = to_desired(self._form.apply(self._resources), self._owner)

    def _ensure_scopes(self) -> None:
        """Start the watch scopes the desired pools need (a started scope stays)."""
        with self._cond:
            self._scopes_dirty = False
            nodes = {s.pool.node_name for s in self._desired.values()}
        owner = self._owner
        nodes.add(owner.name if owner is not None and owner.is_node else None)
        self._scopes.ensure(nodes)

    def _start_watcher(self, scope: Scope) -> None:
        assert self._client is not None and self._version is not None
        watcher = Watcher(
            self._client, self._version, scope, self, self._stop,
            event_delay_s=self._timing.event_delay_s,
            watch_timeout_s=self._timing.watch_timeout_s,
            backoff=Backoff(self._timing.backoff_initial_s, self._timing.backoff_max_s,
                            rng=self._rng),
        )
        self._spawn(watcher.run, f"slices-watch-{len(self._scopes)}")

    def _ready(self, pool: str) -> bool:
        """Whether the scope holding ``pool``'s slices has been listed (caller holds _cond)."""
        state = self._desired.get(pool)
        if state is None:
            return self._scopes.any_listed()
        return self._scopes.listed(state.pool.node_name)

    # -- one pool ---------------------------------------------------------------------------

    def _sync_pool(self, pool: str) -> None:
        assert self._publisher is not None
        with self._cond:
            state = self._desired.get(pool)
        if state is None:
            self._invalid.pop(pool, None)
        elif not self._valid(pool, state):
            return
        try:
            for _ in range(self._timing.conflict_retries):
                desired = effective(state, self._publisher.accepted) if state else None
                existing = self._scopes.existing(pool)
                owner = self._owner_uid.ref()
                plan = plan_pool(
                    self._driver, pool, desired, existing, owner,
                    generation_floor=self._generations.get(pool, 0),
                )
                if self._owner_uid.stale(plan, existing, owner):
                    owner = self._owner_uid.ref(refresh=True)
                    plan = plan_pool(
                        self._driver, pool, desired, existing, owner,
                        generation_floor=self._generations.get(pool, 0),
                    )
                try:
                    self._publisher.execute(plan, state)
                except ConflictError:
                    continue
                self._succeeded(pool, plan)
                return
            raise ApiError("SYNC", pool, 409, "Conflict", "the pool kept changing under us")
        except RejectedSliceError as err:
            assert state is not None
            self._rejected_by_server(pool, state, err)
        except ApiError as err:
            self._failed(pool, err)

    def _valid(self, pool: str, state: PoolState) -> bool:
        """Local limits; an invalid pool is reported once per content and left as it is."""
        problems = state.check(self._driver)
        if not problems:
            self._invalid.pop(pool, None)
            return True
        if self._invalid.get(pool) != state.fingerprint:
            self._invalid[pool] = state.fingerprint
            err = PoolValidationError(pool, problems)
            self._metrics.slice_errors.labels(reason="invalid").inc()
            log.error(str(err), extra={"pool": pool})
            self._report(err)
        return False

    def _node_uid(self, name: str) -> str:
        assert self._client is not None
        return self._client.node_uid(name)

    def _succeeded(self, pool: str, plan: PoolPlan) -> None:
        if plan.writes:
            self._generations[pool] = plan.generation
        if pool in self._failing or pool in self._rejected:
            log.info("publishing recovered", extra={"pool": pool})
        self._failing.discard(pool)
        self._rejected.pop(pool, None)
        self._backoffs.pop(f"pool/{pool}", None)
        self._backoffs.pop(f"rejected/{pool}", None)

    def _rejected_by_server(self, pool: str, state: PoolState, err: RejectedSliceError) -> None:
        """Retry later (capped back-off); say it once per content, quietly on each retry."""
        key = f"rejected/{pool}"
        if key not in self._backoffs:
            self._backoffs[key] = Backoff(
                self._timing.backoff_initial_s, self._timing.rejected_retry_max_s,
                rng=self._rng,
            )
        delay = self._backoffs[key].next()
        self._retry_later(pool, delay)
        self._metrics.slice_errors.labels(reason="invalid").inc()
        fields = {"pool": pool, "slice": err.slice_name, "retry_in_s": round(delay, 2)}
        if self._rejected.get(pool) == state.fingerprint:
            log.debug("ResourceSlice still rejected", extra=fields)
            return
        self._rejected[pool] = state.fingerprint
        log.error(str(err), extra=fields)
        self._report(err)

    def _failed(self, pool: str, err: ApiError) -> None:
        delay = self._backoff(f"pool/{pool}").next()
        self._failing.add(pool)
        self._retry_later(pool, delay)
        self._metrics.slice_errors.labels(
            reason="unavailable" if err.transient else "api_error"
        ).inc()
        error = PublishError(pool, "sync", err, delay)
        log.warning(str(error), extra={"pool": pool})
        self._report(error)
