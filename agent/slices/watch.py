"""Keeping a SliceStore equal to the server: list once, then watch, relist only when needed.

One ``Watcher`` thread per scope (field selector). Usually there is one scope, this node's
slices (``spec.driver=D,spec.nodeName=N``); pools published with a node selector live in a
second, node-less scope that is started only when such a pool exists, because the node
authorizer forbids that list to kubelet credentials.

The watch asks for bookmarks so a reconnect resumes from a recent version instead of
replaying history, reconnects from the last version seen after a dropped stream, and lists
again only on 410 Expired or when the controller asks for a periodic resync.

A list is a watch-list where the server has one (WatchList, on by default since 1.34): the
watch's first events are the current state, up to a bookmark that says they are complete,
and the same stream goes on with changes, as client-go's informers do; one request where a
list and a watch were two. A server without it answers 422, and the watcher lists and
watches apart from then on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.slices.api import ApiError, SliceClient, WatchStream, is_initial_end
from agent.slices.backoff import Backoff
from agent.slices.store import SliceStore, name_of

log = logging.getLogger("agent.slices")

#: What a server without watch-list answers one: 422 (sendInitialEvents forbidden unless the
#: WatchList feature gate is on), or 400 from an older one that does not know the parameters.
_NO_WATCH_LIST = frozenset({400, 422})
#: Watch-lists in a row whose stream ended before their initial events did, before the
#: watcher lists instead (a proxy cutting the stream, a server that never sends the end).
_UNFINISHED_LISTS = 3


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
        #: List by a watch-list (the state as a watch's first events), until the server
        #: shows it has none; then list and watch apart, as before 1.34.
        self._watch_list = True
        self._unfinished_lists = 0
        #: The store holds a complete state as of ``_rv``, which a watch resumes from.
        self._complete = False
        self._rv = ""

    def run(self) -> None:
        scope = self._scope
        while not self._stop.is_set():
            listing = False
            try:
                listing = not self._complete or scope.relist_requested
                if listing:
                    # Until a list completes, nothing resumes from a version of the old one;
                    # a relist asked for while this one runs starts another.
                    self._complete = False
                    scope.relist_requested = False
                if listing and not self._watch_list:
                    self._list()
                    listing = False
                stream = self._open(listing)
                if not scope.set_stream(stream, self._stop.is_set()):
                    return
                if self._backoff.failures:
                    self._backoff.reset()
                    self._sink.watch_recovered(scope)
                try:
                    self._consume(stream, listing)
                finally:
                    scope.set_stream(None, False)
                    stream.close()
                if listing and not self._complete and not (
                        self._stop.is_set() or scope.relist_requested):
                    self._unfinished_lists += 1  # it ended before the whole state came
                    if self._unfinished_lists >= _UNFINISHED_LISTS:
                        self._no_watch_list("its initial events never ended")
            except ApiError as err:
                if self._stop.is_set():
                    return
                if err.expired:
                    # History before our version is gone: only a new list is complete.
                    log.info("watch expired, listing again",
                             extra={"selector": scope.field_selector})
                    self._complete = False
                    continue
                if listing and self._watch_list and err.status in _NO_WATCH_LIST:
                    self._no_watch_list(f"{err.status} {err.reason}")
                    continue
                delay = self._backoff.next(err.retry_after)
                self._sink.watch_failed(scope, err, delay)
                self._stop.wait(delay)
            except Exception as err:  # a bug here must not end the watch for good
                if self._stop.is_set():
                    return
                log.exception("unexpected error in the ResourceSlice watch")
                self._complete = False
                delay = self._backoff.next()
                wrapped = ApiError("WATCH", scope.field_selector, 0, type(err).__name__, str(err))
                self._sink.watch_failed(scope, wrapped, delay)
                self._stop.wait(delay)

    def _open(self, listing: bool) -> WatchStream:
        scope = self._scope
        if listing:
            return self._client.watch_list(self._version, scope.field_selector,
                                           self._watch_timeout_s)
        return self._client.watch(self._version, scope.field_selector, self._rv,
                                  self._watch_timeout_s)

    def _no_watch_list(self, why: str) -> None:
        """List and watch apart from now on (a server without WatchList: 1.32-1.33)."""
        self._watch_list = False
        log.info("the API server has no watch-list; listing ResourceSlices instead",
                 extra={"selector": self._scope.field_selector, "why": why})

    def _list(self) -> None:
        result = self._client.list(self._version, self._scope.field_selector)
        self._listed(result.items, result.resource_version)

    def _listed(self, objects: list[dict[str, Any]], rv: str) -> None:
        """The scope's whole state as of ``rv``, from a list or a watch-list's first events."""
        scope = self._scope
        items = [o for o in objects if scope.accepts(o)]
        changed = scope.store.replace(items, rv)
        self._rv, self._complete = rv, True
        first = not scope.listed
        scope.listed = True
        scope.relist_requested = False
        scope.lists += 1
        self._unfinished_lists = 0
        log.debug("listed slices", extra={"selector": scope.field_selector, "count": len(items)})
        self._sink.schedule(changed, 0.0)
        self._sink.scope_listed(scope, first)

    def _consume(self, stream: WatchStream, listing: bool) -> None:
        """Events until the stream ends (or a stop or relist); ``_rv`` follows the last
        version seen. With ``listing``, the first events are the scope's state, complete at
        the watch-list's end bookmark (``_listed``); a stream that ends before it leaves
        ``_complete`` false."""
        scope = self._scope
        initial: list[dict[str, Any]] | None = [] if listing else None
        for event in stream:
            if self._stop.is_set() or scope.relist_requested:
                break
            if initial is not None:  # a watch-list's current state, until its end bookmark
                if is_initial_end(event):
                    self._listed(initial, event.resource_version or "")
                    initial = None
                elif event.type == "ADDED":
                    initial.append(event.obj)
                continue
            self._rv = event.resource_version or self._rv
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
