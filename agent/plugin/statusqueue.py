"""Claim status reports written after the prepare's answer, by one thread of their own.

A prepared claim's NICs go into its ``status.devices`` (``agent.claim.status``): one more
request to the API server, best effort, that nothing in the prepare's answer depends on. Made
inside the call, it kept the kubelet waiting for a server-side apply (half again a NIC
claim's prepare through the kubelet stand-in, hack/benches/vsupstream), which a Go NIC driver
on the upstream helper does not make it wait for: DRANet writes the same entries from its NRI
hook, when the pod's sandbox starts, after prepare has answered. Here the call hands the write
to this queue and answers; the write follows at once, on this queue's thread.

* After the answer is sent: the gRPC servicer queues the reports of a call when the call has
  ended (``reserve``; ``context.add_callback``), so their thread does not take the
  interpreter's lock from the response being sent.
* One report per claim at a time: a claim whose report is still queued or under way is not
  queued again (the report in the queue reads the same facts).
* Bounded: with ``limit`` reports waiting, the caller writes its own inline (the old path),
  so a slow API server slows the prepares rather than growing a queue without end.
* The thread starts with the first report and ends after ``IDLE_EXIT_S`` without any;
  ``close`` lets the queued reports finish (up to a timeout) and writes later ones inline.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Reports waiting at most; the kubelet makes at most a few calls at once (16 in the benches).
LIMIT = 256
#: The thread ends after this long without a report (a node prepares claims in bursts).
IDLE_EXIT_S = 30.0

Report = Callable[[], None]


class StatusReports:
    """A FIFO of per-claim reports run on one thread, thread-safe; ``report`` never raises."""

    def __init__(self, limit: int = LIMIT, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._limit = limit
        self._idle_exit_s = idle_exit_s
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[tuple[str, Report]] = deque()
        #: Claim UIDs queued or being written.
        self._pending: set[str] = set()
        self._running = False
        self._closed = False

    def submit(self, uid: str, report: Report) -> None:
        """Run ``report`` after this call returns (inline when full or closed); nothing when
        a report of ``uid`` is pending already."""
        start = self.reserve(uid, report)
        if start is not None:
            start()

    def reserve(self, uid: str, report: Report) -> Callable[[], None] | None:
        """``submit`` in two steps: ``uid`` counts as pending from now (``wait_idle`` waits
        for it), and the function returned queues ``report`` when called (the gRPC call's
        end: ``agent.plugin.server``). None when a report of ``uid`` is pending already."""
        with self._cond:
            if uid in self._pending:
                return None
            self._pending.add(uid)
        return lambda: self._enqueue(uid, report)

    def _enqueue(self, uid: str, report: Report) -> None:
        with self._cond:
            inline = self._closed or len(self._queue) >= self._limit
            if not inline:
                self._queue.append((uid, report))
                if not self._running:
                    self._running = True
                    threading.Thread(target=self._work, name="claim-status",
                                     daemon=True).start()
                else:
                    self._cond.notify_all()  # wait_idle's callers wait on it too
        if inline:
            self._run(uid, report)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every report submitted so far is done; False when ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float) -> bool:
        """Let the queued reports finish for up to ``timeout`` seconds; later ones run inline.
        False when some were still pending (they go on, on a daemon thread)."""
        with self._cond:
            self._closed = True
        return self.wait_idle(timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._cond.wait_for(lambda: bool(self._queue), self._idle_exit_s)
                if not self._queue:
                    self._running = False
                    return
                uid, report = self._queue.popleft()
            self._run(uid, report)

    def _run(self, uid: str, report: Report) -> None:
        try:
            report()
        except Exception:  # a report handles its own errors; this is a bug, never the caller's
            log.exception("claim status report failed unexpectedly")
        finally:
            with self._cond:
                self._pending.discard(uid)
                if not self._pending:
                    self._cond.notify_all()
