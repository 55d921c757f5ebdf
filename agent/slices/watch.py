"""Keeping a SliceStore equal to the server: list once, then watch, relist only when needed.

One ``Watcher`` thread per scope (field selector). Usually there is one scope, this node's
slices (``spec.driver=D,spec.nodeName=N``); pools published with a node selector live in a
second, node-less scope that is started only when such a pool exists, because the node
authorizer forbids that list to kubelet credentials.

The watch asks for bookmarks so a reconnect resumes from a recent version instead of
replaying history, reconnects from the last version seen after a dropped stream, and lists
again only on 410 Expired or when the controller asks for a periodic resync.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.slices.api import ApiError, SliceClient, WatchStream
from agent.slices.backoff import Backoff
from agent.slices.store import SliceStore, name_of

log = logging.getLogger("agent.slices")


class Sink(Protocol):
    """What a watcher tells the controller."""

    def schedule(self, pools: Iterable[str], delay: float) -> None: ...

    def scope_listed(self, scope: Scope, first: bool) -> None: ...

    def watch_failed(self, scope: Scope, error: ApiError, retry_in_s: float) -> None: ...

    def watch_recovered(self, scope: Scope) -> None:
        """The server answers again after a failure: retry what waits in back-off now."""


@dataclass
class Scope:
    """One field selector, the store it feeds and the filter on what is ours."""

    field_selector: str
    accepts: Callable[[Mapping[str, Any]], bool] = field(default=lambda obj: True)
    store: SliceStore = field(default_factory=SliceStore)
    listed: bool = False
    relist_requested: bool = False
    lists: int = 0
    _stream: WatchStream | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_stream(self, stream: WatchStream | None, stopping: bool) -> bool:
        """Remember the open stream so another thread can close it; False when stopping."""
        with self._lock:
            if stream is not None and stopping:
                stream.close()
                return False
            self._stream = stream
            return True

    def interrupt(self) -> None:
        """Make the watcher leave its current stream (stop, or relist on request)."""
        with self._lock:
            if self._stream is not None:
                self._stream.close()


class Watcher:
    """The loop of one scope's thread."""

    def __init__(
        self,
        client: SliceClient,
        version: str,
        scope: Scope,
        sink: Sink,
        stop: threading.Event,
        *,
        event_delay_s: float,
        watch_timeout_s: int,
        backoff: Backoff,
    ) -> None:
        self._client = client
        self._version = version
        self._scope = scope
        self._sink = sink
        self._stop = stop
        self._event_delay_s = event_delay_s
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff

    def run(self) -> None:
        scope = self._scope
        need_list = True
        rv = ""
        while not self._stop.is_set():
            try:
                if need_list or scope.relist_requested:
                    rv = self._list()
                    need_list = False
                stream = self._client.watch(
                    self._version, scope.field_selector, rv, self._watch_timeout_s
                )
                if not scope.set_stream(stream, self._stop.is_set()):
                    return
                if self._backoff.failures:
                    self._backoff.reset()
                    self._sink.watch_recovered(scope)
                try:
                    rv = self._consume(stream, rv)
                finally:
                    scope.set_stream(None, False)
                    stream.close()
            except ApiError as err:
                if self._stop.is_set():
                    return
                if err.expired:
                    # History before our version is gone: only a new list is complete.
                    log.info("watch expired, listing again",
                             extra={"selector": scope.field_selector})
                    need_list = True
                    continue
                delay = self._backoff.next(err.retry_after)
                self._sink.watch_failed(scope, err, delay)
                self._stop.wait(delay)
            except Exception as err:  # a bug here must not end the watch for good
                if self._stop.is_set():
                    return
                log.exception("unexpected error in the ResourceSlice watch")
                need_list = True
                delay = self._backoff.next()
                wrapped = ApiError("WATCH", scope.field_selector, 0, type(err).__name__, str(err))
                self._sink.watch_failed(scope, wrapped, delay)
                self._stop.wait(delay)

    def _list(self) -> str:
        scope = self._scope
        result = self._client.list(self._version, scope.field_selector)
        items = [o for o in result.items if scope.accepts(o)]
        changed = scope.store.replace(items, result.resource_version)
        first = not scope.listed
        scope.listed = True
        scope.relist_requested = False
        scope.lists += 1
        log.debug("listed slices", extra={"selector": scope.field_selector, "count": len(items)})
        self._sink.schedule(changed, 0.0)
        self._sink.scope_listed(scope, first)
        return result.resource_version

    def _consume(self, stream: WatchStream, rv: str) -> str:
        scope = self._scope
        for event in stream:
            if self._stop.is_set() or scope.relist_requested:
                break
            rv = event.resource_version or rv
            if event.type == "BOOKMARK":
                continue
            if event.type != "DELETED" and not scope.accepts(event.obj):
                pool = scope.store.drop(name_of(event.obj))
            else:
                pool = scope.store.apply(event.type, event.obj)
            if pool is not None:
                # Someone else changed one of our slices (a kubelet wipe, a hand edit):
                # repair soon, after the rest of a burst of events has arrived.
                self._sink.schedule([pool], self._event_delay_s)
        return rv
