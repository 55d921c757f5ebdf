"""Watch streams: initial events, live events as selector transitions, bookmarks, 410 in-stream.

A stream is one JSON document per line over a chunked 200 answer. Faults close it gracefully
(a normal end, the client re-watches) or abruptly (the socket is shut, the client sees a broken
connection), as a real server restart or a broken network path would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import FieldError, bad_request
from .registry import Registry, Request, options_invalid
from .store import Event, TooOldError, key_text

Obj = dict[str, Any]
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
CLIENT_CHECK_S = 0.25


class WatchSink(Protocol):
    """The HTTP side of a stream (the handler implements it)."""

    def start_stream(self) -> None: ...

    def send_event(self, event: Obj) -> None: ...

    def end_stream(self) -> None: ...

    def abort(self) -> None: ...

    def client_gone(self) -> bool: ...


class WatchControl(Protocol):
    """What the server exposes to streams: stop and drop signals."""

    def watch_epoch(self) -> int: ...

    def stopping(self) -> bool: ...

    def graceful_drop(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class WatchSettings:
    bookmark_interval: float
    default_timeout: float
    too_large_wait: float = 3.0


def _too_old_event(e: TooOldError) -> Obj:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(e),
            "reason": "Expired",
            "code": 410,
        },
    }


def _check_options(req: Request, watch_list: bool = True) -> tuple[bool, bool]:
    """(send initial events, annotate their end) after the 422 checks of the real server;
    ``watch_list``: the WatchList gate (off: 1.32-1.33's default)."""
    p = req.params
    sie_raw = p.get("sendInitialEvents")
    match = p.get("resourceVersionMatch", "")
    rv = p.get("resourceVersion", "")
    if sie_raw is not None:
        sie = sie_raw.lower() in ("1", "true")
        errs = []
        if not watch_list:
            errs.append(
                FieldError(
                    "Forbidden",
                    "sendInitialEvents",
                    None,
                    "sendInitialEvents is forbidden for watch unless the WatchList feature "
                    "gate is enabled",
                )
            )
        if match != "NotOlderThan":
            errs.append(
                FieldError(
                    "Forbidden",
                    "resourceVersionMatch",
                    None,
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
        if errs:
            raise options_invalid("ListOptions", errs)
        # Without allowWatchBookmarks it is no watch-list request (isListWatchRequest
        # upstream): the initial events still come, but no initial-events-end bookmark.
        return sie, sie and req.flag("allowWatchBookmarks")
    if match:
        raise options_invalid(
            "ListOptions",
            [
                FieldError(
                    "Forbidden",
                    "resourceVersionMatch",
                    None,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                    "provided",
                )
            ],
        )
    # With WatchList on (1.34+), "" and "0" start with the current state, as ADDED events.
    return rv in ("", "0"), False


class WatchStream:
    def __init__(
        self,
        registry: Registry,
        req: Request,
        sink: WatchSink,
        control: WatchControl,
        settings: WatchSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reg = registry
        self.req = req
        self.sink = sink
        self.control = control
        self.settings = settings
        self.clock = clock
        self.match = registry.matcher(req)
        self.plural = req.route.rtype.plural

    def _wire(self, obj: Obj, rv: int | None = None) -> Obj:
        out = self.reg.served(self.req.route, obj)
        if rv is not None:
            out["metadata"] = {**out["metadata"], "resourceVersion": str(rv)}
        return out

    def _bookmark(self, rv: int, initial_end: bool = False) -> Obj:
        route = self.req.route
        meta: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": route.rtype.kind,
                "apiVersion": route.rtype.api_version(route.version),
                "metadata": meta,
            },
        }

    def _translate(self, ev: Event) -> Obj | None:
        """Selector transitions: leaving the selection is DELETED, entering it is ADDED."""
        if ev.type == "DELETED":
            return {"type": "DELETED", "object": self._wire(ev.obj)} if self.match(ev.obj) else None
        now = self.match(ev.obj)
        before = ev.old is not None and self.match(ev.old)
        if now and before:
            return {"type": "MODIFIED", "object": self._wire(ev.obj)}
        if now:
            return {"type": "ADDED", "object": self._wire(ev.obj)}
        if before and ev.old is not None:
            return {"type": "DELETED", "object": self._wire(ev.old, ev.rv)}
        return None

    def _start_position(self, initial: bool) -> tuple[int, list[Obj]]:
        store = self.reg.store
        rv_text = self.req.params.get("resourceVersion", "")
        try:
            wanted = int(rv_text) if rv_text not in ("", "0") else 0
        except ValueError:
            raise bad_request(f"invalid resource version: {rv_text}") from None
        with store.cond:
            self.reg.wait_for_revision(wanted)
            if initial:
                snap = store.snapshot(self.plural)
                objs = [snap[k] for k in sorted(snap, key=key_text) if self.match(snap[k])]
                return store.rv, objs
            # sendInitialEvents=false without a revision starts from now.
            return (wanted or store.rv), []

    def run(self) -> None:
        initial, annotate = _check_options(self.req, self.reg.gates.get("WatchList", True))
        p = self.req.params
        bookmarks = self.req.flag("allowWatchBookmarks")
        try:
            timeout = (
                float(p["timeoutSeconds"])
                if p.get("timeoutSeconds")
                else self.settings.default_timeout
            )
        except ValueError:
            raise bad_request(f"invalid timeoutSeconds: {p['timeoutSeconds']}") from None
        pos, objs = self._start_position(initial)
        epoch = self.control.watch_epoch()
        self.sink.start_stream()
        for obj in objs:
            self.sink.send_event({"type": "ADDED", "object": self._wire(obj)})
        if annotate and bookmarks:
            self.sink.send_event(self._bookmark(pos, initial_end=True))
        deadline = self.clock() + timeout
        next_bookmark = self.clock() + self.settings.bookmark_interval
        store = self.reg.store
        while True:
            bookmark_rv = None
            with store.cond:
                while True:
                    if self.control.stopping() or self.control.watch_epoch() != epoch:
                        if self.control.graceful_drop() and not self.control.stopping():
                            self.sink.end_stream()
                        else:
                            self.sink.abort()
                        return
                    try:
                        events = store.events_after(self.plural, pos)
                    except TooOldError as e:
                        self.sink.send_event(_too_old_event(e))
                        self.sink.end_stream()
                        return
                    if events:
                        break
                    now = self.clock()
                    if now >= deadline or (bookmarks and now >= next_bookmark):
                        bookmark_rv = store.rv
                        break
                    if self.sink.client_gone():
                        self.sink.abort()
                        return
                    wake = min(deadline, next_bookmark) if bookmarks else deadline
                    # Wake at least every CLIENT_CHECK_S to notice a client that went away.
                    store.cond.wait(timeout=min(CLIENT_CHECK_S, max(0.0, wake - now)))
            for ev in events if bookmark_rv is None else []:
                out = self._translate(ev)
                if out is not None:
                    self.sink.send_event(out)
                pos = ev.rv
            if bookmark_rv is not None:
                pos = max(pos, bookmark_rv)
                if bookmarks:
                    self.sink.send_event(self._bookmark(pos))
                    next_bookmark = self.clock() + self.settings.bookmark_interval
                if self.clock() >= deadline:
                    self.sink.end_stream()
                    return
