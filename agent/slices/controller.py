"""The embedded ResourceSlice controller: this node's pools in the cluster, always.

Threads, not asyncio (DESIGN.md): one worker that syncs pools one at a time, and one watcher
per watch scope (watch.py). ``update()`` only records the new desired state and wakes the
worker; it never blocks on the network. The worker takes due pools from what the watchers
told it (events.py), and syncs each (reconcile.py): the pure ``plan_pool`` (sync.py) plans it
and the Publisher (publish.py) executes the plan.

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
from collections.abc import Callable

from agent.common.metrics import Metrics
from agent.slices.api import ApiError, SliceClient
from agent.slices.backoff import Backoff
from agent.slices.events import Events
from agent.slices.listattrs import ListForm
from agent.slices.owner import Owner, OwnerUID
from agent.slices.pools import to_desired
from agent.slices.publish import Publisher
from agent.slices.reconcile import PoolSync
from agent.slices.scopes import Scopes
from agent.slices.timing import Timing
from agent.slices.versions import NoResourceAPIError, choose_version
from agent.slices.watch import Scope, Watcher
from discovery.model import DriverResources

log = logging.getLogger("agent.slices")


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
        node_uid: str | None = None,
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
            known=node_uid,
        )
        self._stop = threading.Event()
        self._form = ListForm(list_attributes)  # decided after API discovery, if "auto"
        self._resources = resources
        self._desired = to_desired(self._form.apply(resources), owner)
        self._events = Events(
            self._desired, lambda: self._desired, burst_max_s=self._timing.burst_max_s,
            metrics=self._metrics, report=self._report,
        )
        self._cond = self._events.cond  # guards _desired, _resources and the pending pools
        self._in_sync = self._events.in_sync
        self._scopes = Scopes(driver, owner, self._start_watcher)
        self._scopes_dirty = False
        self._threads: list[threading.Thread] = []
        self._version: str | None = None
        # Worker-only state.
        self._sync = PoolSync(
            driver, self._owner_uid, self._scopes.existing, self._events.retry_later,
            timing=self._timing, rng=self._rng, metrics=self._metrics, report=self._report,
        )
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
            self._events.due_now(old | set(self._desired))

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
            self._owner_uid.new_batch(bool(due))  # at most one Node lookup per batch of pools
            for pool in due or ():
                if self._stopping():
                    return
                with self._cond:
                    state = self._desired.get(pool)
                self._sync.sync(pool, state)
                self._worked = True

    def _take_due(self) -> list[str] | None:
        """Pools due now; None after waiting (for work, a stop, or the periodic resync)."""
        with self._cond:
            if self._events.take_recovered():
                self._sync.forget_pool_backoffs()
            now = time.monotonic()
            if now >= self._next_resync:
                self._next_resync = now + self._resync_period_s
                self._resync()
            recheck = self._owner_uid.recheck_at
            if recheck is not None and now >= recheck:
                # Look for the missing Node again: the next sync of any pool does it.
                self._owner_uid.recheck_at = recheck = None
                self._events.due_by(self._desired, now)
            due, waiting = self._events.take_due(self._ready, now)
            if due:
                return due
            if not self._events.pending and self._scopes.all_listed():
                self._mark_synced()
            # Pools waiting for their scope's first list are woken by scope_listed().
            wait = min([self._next_resync - now, *(t - now for t in waiting),
                        *([recheck - now] if recheck is not None else [])])
            if self._external_stop is not None:
                wait = min(wait, self._timing.stop_poll_s)
            self._cond.wait(max(wait, 0.0))
            return None

    def _mark_synced(self) -> None:
        if not self._sync.clean:
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
        backoff = Backoff(self._timing.backoff_initial_s, self._timing.backoff_max_s,
                          rng=self._rng)
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
                delay = backoff.next(err.retry_after)
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
                self._sync.publisher = Publisher(
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
            self._client, self._version, scope, self._events, self._stop,
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

    def _node_uid(self, name: str) -> str:
        assert self._client is not None
        return self._client.node_uid(name)
