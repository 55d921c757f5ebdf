"""What the API server holds, as far as this process knows: one store per watch scope.

Three sources feed it: the initial (and periodic) list, watch events, and the answers to our
own writes. The last is what hides watch lag: right after a create the store already has the
slice, so a sync that runs before the watch event arrives does not create it twice. Every
entry is kept with its resourceVersion and older news is dropped, so the echo of our own
write changes nothing and wakes nobody. Deletions leave a tombstone so a late event cannot
resurrect a deleted slice.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """The integer resourceVersion (etcd revision); None when absent or not a number."""
    value = obj.get("metadata", {}).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def pool_of(obj: Mapping[str, Any]) -> str:
    name = obj.get("spec", {}).get("pool", {}).get("name")
    return name if isinstance(name, str) else ""


def name_of(obj: Mapping[str, Any]) -> str:
    name = obj.get("metadata", {}).get("name")
    return name if isinstance(name, str) else ""


def _newer(candidate: int | None, known: int | None) -> bool:
    # Unparsable versions cannot be ordered; accept them rather than ignore real news.
    return candidate is None or known is None or candidate > known


class SliceStore:
    """Slices of one watch scope by name. Thread-safe; objects are replaced, never mutated."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objs: dict[str, dict[str, Any]] = {}
        self._tombstones: dict[str, int | None] = {}
        # Highest version seen from lists and watch events (the watcher's thread), never
        # from our writes: a list is always taken after everything its thread saw before.
        self._highest = 0

    def _seen(self, rv: int | None) -> None:
        if rv is not None and rv > self._highest:
            self._highest = rv

    def replace(self, items: list[dict[str, Any]], list_rv: str) -> set[str]:
        """Take a list result; return the pools whose slices changed.

        Our own writes newer than the list survive it; our own deletes newer than it stay
        deleted. A list version *below* anything seen means the server lost its state
        (restored etcd, fresh test server): then the list is taken as the whole truth.
        """
        try:
            rv = int(list_rv)
        except ValueError:
            rv = None
        with self._lock:
            fresh = {name_of(o): o for o in items}
            went_back = rv is not None and rv < self._highest
            if not went_back:
                for name, obj in self._objs.items():
                    if name not in fresh and not _newer(rv, resource_version(obj)):
                        fresh[name] = obj  # written by us after the list was taken
                for name, dead in list(self._tombstones.items()):
                    if name in fresh and not _newer(rv, dead):
                        del fresh[name]
            changed = {
                pool_of(o) for n, o in self._objs.items()
                if n not in fresh or resource_version(fresh[n]) != resource_version(o)
            }
            changed |= {pool_of(o) for n, o in fresh.items() if n not in self._objs}
            self._objs = fresh
            self._tombstones = {
                n: t for n, t in self._tombstones.items()
                if not went_back and (rv is None or t is None or t > rv)
            }
            if went_back:
                self._highest = 0
            self._seen(rv)
            return changed

    def apply(self, event_type: str, obj: dict[str, Any]) -> str | None:
        """Take a watch event; return its pool when it changed the store, else None."""
        name, rv = name_of(obj), resource_version(obj)
        with self._lock:
            self._seen(rv)
            known = self._objs.get(name)
            if event_type == "DELETED":
                if known is None or not _newer(resource_version(known), rv):
                    self._tombstones[name] = rv
                    if known is None:
                        return None
                    del self._objs[name]
                    return pool_of(known)
                return None
            if name in self._tombstones and not _newer(rv, self._tombstones[name]):
                return None
            if known is not None and not _newer(rv, resource_version(known)):
                return None  # our own write coming back, or older news
            self._objs[name] = obj
            return pool_of(obj)

    def written(self, obj: dict[str, Any]) -> None:
        """Record what the server answered to our create or update."""
        name, rv = name_of(obj), resource_version(obj)
        with self._lock:
            known = self._objs.get(name)
            if known is None or _newer(rv, resource_version(known)):
                self._objs[name] = obj
                self._tombstones.pop(name, None)

    def deleted(self, name: str, rv: int | None) -> None:
        """Record our own delete (``rv``: the deletion revision, when the server said it)."""
        with self._lock:
            self._objs.pop(name, None)
            self._tombstones[name] = rv

    def forget(self, name: str) -> None:
        """The server says it does not have ``name`` (404)."""
        with self._lock:
            self._objs.pop(name, None)

    def drop(self, name: str) -> str | None:
        """The object left our scope (e.g. its owner reference was removed by hand)."""
        with self._lock:
            obj = self._objs.pop(name, None)
            return pool_of(obj) if obj is not None else None

    def pool(self, pool: str) -> list[dict[str, Any]]:
        with self._lock:
            return [o for o in self._objs.values() if pool_of(o) == pool]

    def pools(self) -> set[str]:
        with self._lock:
            return {pool_of(o) for o in self._objs.values()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._objs)
