"""One pool's sync, on the worker thread: plan it, have the Publisher write it, and decide
what a failure means for the next try.

Errors are retried like upstream's rate-limited work queue: a pool whose sync failed is tried
again after an exponential back-off, reset only by success. That includes a 422: the slice
may become acceptable without any change on our side (the server is upgraded, a feature
gate or admission policy changes), so it is not abandoned. A local validation failure is
not retried, as upstream: nothing outside the agent can make that content valid.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.common.metrics import Metrics
from agent.slices.api import ApiError
from agent.slices.backoff import Backoff
from agent.slices.errors import PublishError, RejectedSliceError
from agent.slices.owner import OwnerUID
from agent.slices.pools import PoolState, effective
from agent.slices.publish import ConflictError, Publisher
from agent.slices.sync import PoolPlan, plan_pool
from agent.slices.timing import Timing
from agent.slices.validate import PoolValidationError

__all__ = ["PoolSync"]

log = logging.getLogger("agent.slices")


class PoolSync:
    """Syncs one pool at a time and keeps what each pool's last sync left (worker only)."""

    def __init__(
        self,
        driver: str,
        owner_uid: OwnerUID,
        existing: Callable[[str], Sequence[Mapping[str, Any]]],
        retry_later: Callable[[str, float], None],
        *,
        timing: Timing,
        rng: random.Random,
        metrics: Metrics,
        report: Callable[[Exception], None],
    ) -> None:
        self._driver = driver
        self._owner_uid = owner_uid
        self._existing = existing  # every stored slice of a pool, from all scopes
        self._retry_later = retry_later
        self._timing = timing
        self._rng = rng
        self._metrics = metrics
        self._report = report
        #: Set once the API version is known; no pool is synced before.
        self.publisher: Publisher | None = None
        self._backoffs: dict[str, Backoff] = {}
        self._failing: set[str] = set()
        self._generations: dict[str, int] = {}  # last generation published per pool
        self._rejected: dict[str, str] = {}  # pool -> fingerprint refused with 422
        self._invalid: dict[str, str] = {}  # pool -> fingerprint failing local checks

    @property
    def clean(self) -> bool:
        """No pool is failing, rejected by the server or invalid."""
        return not (self._failing or self._rejected or self._invalid)

    def forget_pool_backoffs(self) -> None:
        """The server answers again: failed pools start from the shortest delay."""
        self._backoffs = {k: v for k, v in self._backoffs.items() if not k.startswith("pool/")}

    def sync(self, pool: str, state: PoolState | None) -> None:
        """Bring ``pool`` to ``state`` (None: the pool is no longer desired)."""
        assert self.publisher is not None
        if state is None:
            self._invalid.pop(pool, None)
        elif not self._valid(pool, state):
            return
        try:
            for _ in range(self._timing.conflict_retries):
                desired = effective(state, self.publisher.accepted) if state else None
                existing = self._existing(pool)
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
                    self.publisher.execute(plan, state)
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
        delay = self._backoff(f"pool/{pool}").next(err.retry_after)
        self._failing.add(pool)
        self._retry_later(pool, delay)
        self._metrics.slice_errors.labels(
            reason="unavailable" if err.transient else "api_error"
        ).inc()
        error = PublishError(pool, "sync", err, delay)
        log.warning(str(error), extra={"pool": pool})
        self._report(error)

    def _backoff(self, key: str) -> Backoff:
        if key not in self._backoffs:
            self._backoffs[key] = Backoff(
                self._timing.backoff_initial_s, self._timing.backoff_max_s, rng=self._rng
            )
        return self._backoffs[key]
