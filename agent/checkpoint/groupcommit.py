"""Group commit: concurrent changes of the checkpoint share one write and one fsync.

The checkpoint is one file, rewritten whole by every change, so N callers each writing their
own change queue behind one lock and pay N fsyncs one after the other. Here a caller hands its
change in and one caller at a time *leads*: it takes every change queued so far as one batch,
applies them in order, writes the file once and wakes the callers whose changes it wrote. The
changes that arrive meanwhile form the next batch, which the first of them leads (the leader
hands over and returns: nobody serves others' batches after its own is done). One caller
alone leads at once, with no thread switch, so a lone prepare pays nothing for this.

A waiting caller blocks on a lock of its own (acquired once at creation, released by whoever
wakes it): one allocation and no condition variable per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Request:
    """One caller's change (None: a read), its outcome once ``done``."""

    __slots__ = ("_wake", "change", "done", "durable", "error", "result")

    def __init__(self, change: Callable[[Any], Any] | None, durable: bool) -> None:
        self.change = change
        self.durable = durable
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self._wake: Any = None  # a held lock while the caller waits, None when it leads


class GroupCommit:
    """Runs ``commit(batch)`` for batches of requests, one batch at a time.

    ``commit`` sets each request's ``result`` or ``error``; whatever it raises becomes the
    error of every request of the batch it left without one.
    """

    def __init__(self, commit: Callable[[list[Request]], None]) -> None:
        self._commit = commit
        self._mutex = threading.Lock()
        self._queue: list[Request] = []
        self._leading = False

    def waiting(self) -> int:
        """How many requests wait for the batch in progress to end (0 when none is)."""
        with self._mutex:
            return len(self._queue)

    def run(self, request: Request) -> Any:
        """Commit ``request`` (in a batch with whatever else is queued) and return its
        outcome."""
        with self._mutex:
            if self._leading:
                self._queue.append(request)
                wake = request._wake = threading.Lock()
                wake.acquire()
            else:
                self._leading, wake = True, None
        if wake is None:
            batch = [request]  # nobody was writing: this one alone, at once
        else:
            wake.acquire()  # released once done, or when the leader hands over to this one
            if request.done:
                if request.error is not None:
                    raise request.error
                return request.result
            with self._mutex:
                batch, self._queue = self._queue, []
        try:
            self._commit(batch)
        except BaseException as err:
            for item in batch:
                if item.error is None:
                    item.error = err
        finally:
            with self._mutex:
                for item in batch:
                    item.done = True
                if self._queue:
                    self._queue[0]._wake.release()  # it leads the next batch
                else:
                    self._leading = False
            for item in batch:
                if item._wake is not None and item is not request:
                    item._wake.release()
        if request.error is not None:
            raise request.error
        return request.result
