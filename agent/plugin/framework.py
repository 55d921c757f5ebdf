"""The generic kubelet-plugin layer: what every DRA driver does around its own preparation.

For each claim of a call: fetch it from the API server (never from a cache: the kubelet just
checked it), check that its UID is the one the kubelet means, that it is allocated, then hand
it to the preparer, serialised per claim UID. The answer has exactly one entry per requested
UID; a claim's failure is its own entry's error and never hides the others.

After a successful prepare, the claim's NICs are reported in its ``status.devices``
(``agent.claim.status``), best effort, after the answer: the call finds the NICs and queues
the write (``agent.plugin.statusqueue``), which a thread of its own makes at once.
Failpoints (``agent.common.failpoints``) mark the steps a crash test kills the agent at.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.checkpoint.model import ClaimRecord
from agent.claim.identity import check_uid
from agent.claim.model import Claim, ClaimError, ClaimNotAllocatedError, ClaimRef
from agent.claim.parse import parse_claim
from agent.claim.status import ClaimStatusWriter, NicStatus
from agent.common.failpoints import Failpoints, Point, hit
from agent.common.filelock import held
from agent.common.metrics import Metrics
from agent.plugin.apiclaims import APIClaimSource
from agent.plugin.driver import ClaimSource, ClaimStatusReporter, Preparer
from agent.plugin.statusqueue import StatusReports

log = logging.getLogger(__name__)

__all__ = ["MAX_CLAIMS_PER_CALL", "ClaimOutcome", "PluginFramework"]


#: Claims one call may carry. The kubelet sends one call per pod with that pod's claims
#: (not yet prepared) for this driver; a pod with more than a handful is rare, and 256 is
#: the API's own bound on the pods sharing one claim (``reservedFor``). Beyond it a call is
#: not a pod's and its extra claims are refused unread: before this bound, a 20,000-claim call
#: made 20,000 GETs.
MAX_CLAIMS_PER_CALL = 256

#: ``() -> True`` once the caller no longer waits for the answer.
Gone = Callable[[], bool]


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """One claim's answer: a record (prepare) or nothing (unprepare), or an error message."""

    record: ClaimRecord | None = None
    error: str = ""


class _KeyedLocks:
    """One lock per claim UID, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._mutex:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._mutex:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class PluginFramework:
    """Claims in, outcomes out; used by both gRPC service versions.

    ``status``: where prepared NICs are reported; by default, when claims come from the API
    server (``APIClaimSource``), a ``ClaimStatusWriter`` on the same client, so the agent that
    may read a claim also tries to report its NICs; None otherwise. ``failpoints``: crash-test
    hooks (``Failpoints.from_env``), shared with the preparer: setting ``failpoints`` later
    sets both.
    """

    def __init__(
        self,
        driver: str,
        claims: ClaimSource,
        preparer: Preparer,
        metrics: Metrics | None = None,
        serialize_lock: Path | None = None,
        *,
        status: ClaimStatusReporter | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.driver = driver
        self.claims = claims
        self.preparer = preparer
        self.metrics = metrics or Metrics()
        if status is None and isinstance(claims, APIClaimSource):
            status = ClaimStatusWriter(
                claims.api_client, driver, preparer.node_name, metrics=self.metrics
            )
        self.status = status
        if failpoints is not None:
            self.failpoints = failpoints
        self._locks = _KeyedLocks()
        #: UIDs whose NICs this process knows to be in the claim's status, so a repeat that the
        #: checkpoint answers reads the claim only when a report is still owed.
        self._reported: set[str] = set()
        #: The status writes, made after the answer (``agent.plugin.statusqueue``).
        self._reports = StatusReports()
        #: Rolling-update mode: two agent instances share the plugin directory and either may
        #: get any call, so every claim operation also holds this cross-process file lock.
        self._serialize_lock = serialize_lock

    @property
    def failpoints(self) -> Failpoints | None:
        return self.preparer.failpoints

    @failpoints.setter
    def failpoints(self, value: Failpoints | None) -> None:
        # One set of points for the whole call path: the preparer holds it, we read it.
        self.preparer.failpoints = value

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every claim status report queued so far is written (or failed); False
        when ``timeout`` ran out first."""
        return self._reports.wait_idle(timeout)

    def close(self, timeout: float) -> bool:
        """The server stops: let the queued status reports finish for up to ``timeout``
        seconds (later ones are written inline); False when some were still pending."""
        return self._reports.close(timeout)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The cross-instance lock (rolling-update mode only; a no-op otherwise).

        Start-up recovery holds it too, so a new instance never rolls back a PrepareStarted
        record that the old instance is still completing.
        """
        if self._serialize_lock is None:
            yield
            return
        with held(self._serialize_lock):
            yield

    @contextlib.contextmanager
    def _claim_lock(self, uid: str) -> Iterator[None]:
        with self._locks.hold(uid), self.exclusive():
            yield

    def prepare(
        self, refs: Sequence[ClaimRef], request_id: int = 0, *, gone: Gone = _never,
        later: list[Callable[[], None]] | None = None,
    ) -> dict[str, ClaimOutcome]:
        """One outcome per claim. ``gone()`` is asked before each claim: once it is true (the
        caller's deadline passed or it cancelled) the claims not started get an error and no
        work. Claims beyond ``MAX_CLAIMS_PER_CALL`` get an error and are never fetched.

        ``later``: where the claim status reports go, to be started by the caller once its
        answer is sent (each one counts for ``settle`` from now); None: started at once."""
        def one(ref: ClaimRef, request_id: int) -> ClaimOutcome:
            return self._prepare_one(ref, request_id, later)

        return self._each("prepare", refs, request_id, gone, one)

    def unprepare(
        self, refs: Sequence[ClaimRef], request_id: int = 0, *, gone: Gone = _never
    ) -> dict[str, ClaimOutcome]:
        return self._each("unprepare", refs, request_id, gone, self._unprepare_one)

    def _each(
        self,
        op: str,
        refs: Sequence[ClaimRef],
        request_id: int,
        gone: Gone,
        one: Callable[[ClaimRef, int], ClaimOutcome],
    ) -> dict[str, ClaimOutcome]:
        out: dict[str, ClaimOutcome] = {}
        taken = refs[:MAX_CLAIMS_PER_CALL]
        for i, ref in enumerate(taken):
            if gone():
                out.update(self._not_done(
                    op, taken[i:], request_id, "deadline",
                    "the caller's deadline passed (or it cancelled) before this claim was reached",
                ))
                break
            out[ref.uid] = one(ref, request_id)
        if len(refs) > MAX_CLAIMS_PER_CALL:
            out.update(self._not_done(
                op, refs[MAX_CLAIMS_PER_CALL:], request_id, "too_many_claims",
                f"the call names {len(refs)} claims, over the limit of {MAX_CLAIMS_PER_CALL} "
                "per call (the kubelet sends one pod's claims per call)",
            ))
        return out

    def _not_done(
        self,
        op: str,
        refs: Sequence[ClaimRef],
        request_id: int,
        reason: str,
        why: str,
    ) -> dict[str, ClaimOutcome]:
        """Claims given an error without any work: one log line for all of them (a call may
        carry thousands), one error entry each."""
        self.metrics.claim_errors.labels(op, reason).inc(len(refs))
        log.warning(
            f"{op} not attempted",
            extra={
                "request": request_id, "reason": reason, "claims": len(refs),
                "claim": refs[0].uid, "error": why,
            },
        )
        verb = "prepared" if op == "prepare" else "unprepared"
        return {ref.uid: ClaimOutcome(error=f"claim {ref}: not {verb}: {why}") for ref in refs}

    def _prepare_one(
        self, ref: ClaimRef, request_id: int, later: list[Callable[[], None]] | None
    ) -> ClaimOutcome:
        start = time.perf_counter()
        try:
            if not ref.uid or not ref.name or not ref.namespace:
                raise ClaimError(str(ref), "the kubelet sent an incomplete claim reference")
            check_uid(ref)
            # A repeat of a completed prepare is answered from the checkpoint, so an API
            # server outage does not fail a pod that already has its devices (its NICs were
            # reported by the first prepare).
            with self._claim_lock(ref.uid):
                recorded = self.preparer.prepare_recorded(ref)
            if recorded is not None:
                if self.status is not None and ref.uid not in self._reported:
                    self._report_recorded(ref, recorded, later)
                return self._prepared(ref, recorded, request_id, start, "checkpoint")
            # Fetched before taking the claim's lock, as the upstream helper does: a slow API
            # server must not hold up a concurrent unprepare of the same claim.
            obj = self.claims.get(ref)
            hit(self.failpoints, Point.PREPARE_AFTER_CLAIM_GET, ref.uid)
            claim = parse_claim(obj, expected=ref)
            if not claim.allocated:
                raise ClaimNotAllocatedError(
                    str(ref), "not allocated; the scheduler has not placed it on a node yet"
                )
            with self._claim_lock(ref.uid):
                record = self.preparer.prepare(claim)
            if self.status is not None:
                self._report_status(obj, claim, later)
            hit(self.failpoints, Point.PREPARE_BEFORE_ANSWER, ref.uid)
        except ClaimError as err:
            return self._failed("prepare", ref, err.reason, str(err), request_id)
        except Exception as err:  # a bug or the host: still this claim's answer only
            log.exception(
                "prepare failed unexpectedly", extra={"claim": ref.uid, "request": request_id}
            )
            return self._failed(
                "prepare", ref, "internal", f"claim {ref}: internal error: {err}", request_id
            )
        return self._prepared(ref, record, request_id, start, "api")

    def _prepared(
        self, ref: ClaimRef, record: ClaimRecord, request_id: int, start: float, source: str
    ) -> ClaimOutcome:
        log.info(
            "claim prepared",
            extra={
                "request": request_id,
                "claim": ref.uid,
                "namespace": ref.namespace,
                "claim_name": ref.name,
                "pool": self.preparer.pool,
                "devices": ",".join(d.device for d in record.devices),
                "source": source,
                "seconds": round(time.perf_counter() - start, 4),
            },
        )
        return ClaimOutcome(record=record)

    def _unprepare_one(self, ref: ClaimRef, request_id: int) -> ClaimOutcome:
        try:
            # No check of the UID here: whatever it is, the preparer succeeds when it never
            # prepared it, and the kubelet keeps a pod terminating until unprepare succeeds.
            with self._claim_lock(ref.uid):
                self.preparer.unprepare(ref.uid, ref)
            self._reported.discard(ref.uid)
            hit(self.failpoints, Point.UNPREPARE_BEFORE_ANSWER, ref.uid)
        except ClaimError as err:
            return self._failed("unprepare", ref, err.reason, str(err), request_id)
        except Exception as err:
            log.exception("unprepare failed", extra={"claim": ref.uid, "request": request_id})
            return self._failed("unprepare", ref, "internal", f"claim {ref}: {err}", request_id)
        log.info(
            "claim unprepared",
            extra={"request": request_id, "claim": ref.uid, "claim_name": ref.name},
        )
        return ClaimOutcome()

    def _report_status(
        self, obj: Mapping[str, Any], claim: Claim, later: list[Callable[[], None]] | None
    ) -> None:
        """Best effort, outside the claim lock: the claim is prepared whatever happens here.
        The NICs are found now; their write is queued, to be made after the answer."""
        nics = self._nics(claim)
        if nics is None:
            return
        uid = claim.ref.uid
        if not nics:
            self._reported.add(uid)  # nothing to report, ever
            return
        self._queue(uid, lambda: self._write_status(uid, obj, nics), later)

    def _queue(self, uid: str, report: Callable[[], None],
               later: list[Callable[[], None]] | None) -> None:
        """``report`` to the status queue now, or once the caller's answer is sent."""
        if later is None:
            self._reports.submit(uid, report)
            return
        start = self._reports.reserve(uid, report)
        if start is not None:
            later.append(start)

    def _nics(self, claim: Claim) -> list[NicStatus] | None:
        """What the claim's status should say about its NICs; None (logged, counted) when
        that cannot be told."""
        try:
            return self.preparer.network_status(claim)
        except Exception:  # prepare just succeeded with the same inputs: a bug, not the claim's
            log.exception("reporting the claim's NICs failed", extra={"claim": claim.ref.uid})
            self.metrics.claim_status_errors.inc()
            return None

    def _write_status(self, uid: str, obj: Mapping[str, Any], nics: list[NicStatus]) -> None:
        """The queued write (``agent.plugin.statusqueue``'s thread): never raises."""
        assert self.status is not None
        try:
            written = self.status.report(obj, nics)
        except Exception:  # a reporter's bug: the claim is prepared all the same
            log.exception("reporting the claim's NICs failed", extra={"claim": uid})
            self.metrics.claim_status_errors.inc()
            return
        if written:
            self._reported.add(uid)

    def _report_recorded(
        self, ref: ClaimRef, record: ClaimRecord, later: list[Callable[[], None]] | None
    ) -> None:
        """A repeat answered from the checkpoint whose NICs may not be in the claim's status
        yet (the first report failed, or this process has not seen the claim): a claim its
        record shows has no NICs is settled at once; else a report is queued, which reads
        the claim. Never fails the prepare."""
        claim = self.preparer.recorded_claim(ref, record)
        if claim is not None:
            nics = self._nics(claim)
            if nics is None:
                return
            if not nics:
                self._reported.add(ref.uid)
                return
        self._queue(ref.uid, lambda: self._reread_and_report(ref, claim), later)

    def _reread_and_report(self, ref: ClaimRef, claim: Claim | None) -> None:
        """``_report_recorded``'s queued part: read the claim, then report as a prepare does."""
        try:
            obj = self.claims.get(ref)
            current = parse_claim(obj, expected=ref)
        except ClaimError as err:
            log.info("claim status not reported: cannot read the claim",
                     extra={"claim": ref.uid, "error": str(err)})
            return
        except Exception:  # a bug, not the claim's: the answer stands
            log.exception("reporting the claim's NICs failed", extra={"claim": ref.uid})
            self.metrics.claim_status_errors.inc()
            return
        nics = self._nics(claim or current)
        if nics is not None and not nics:
            self._reported.add(ref.uid)
        elif nics:
            self._write_status(ref.uid, obj, nics)

    def _failed(
        self, op: str, ref: ClaimRef, reason: str, message: str, request_id: int
    ) -> ClaimOutcome:
        self.metrics.claim_errors.labels(op, reason).inc()
        log.warning(
            f"{op} failed",
            extra={
                "request": request_id, "claim": ref.uid, "namespace": ref.namespace,
                "claim_name": ref.name, "reason": reason, "error": message,
            },
        )
        return ClaimOutcome(error=message)
