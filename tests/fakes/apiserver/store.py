"""The object store: one revision counter, objects in storage form, a bounded event log.

Like etcd behind the real server, every write of any object takes the next integer revision, and
each resource keeps a bounded history. That history answers watches from an old revision, rebuilds
the snapshot a continue token points at, and decides when a revision is too old (410 Expired).
All callers hold `cond` around a read-modify-write, which makes it one transaction.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)


def key_text(key: Key) -> str:
    """`ns/name` or `name`: the etcd key suffix, whose string order is the list order."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


@dataclass(frozen=True, slots=True)
class Event:
    """One committed change. `obj` is the new state (for DELETED the last state, carrying the
    deletion revision); `old` is the state before, None for ADDED."""

    rv: int
    type: str
    key: Key
    obj: Obj
    old: Obj | None


@dataclass
class ResourceState:
    objects: dict[Key, Obj] = field(default_factory=dict)
    log: deque[Event] = field(default_factory=deque)
    # Every event with rv > compacted is still in the log.
    compacted: int = 0
    # Server-side apply ownership: key -> manager -> set of owned field paths.
    owners: dict[Key, dict[str, set[tuple[str, ...]]]] = field(default_factory=dict)


class TooOldError(Exception):
    """The history no longer reaches back to the requested revision."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class Store:
    def __init__(self, log_size: int, start_rv: int = 0) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.rv = start_rv
        self.log_size = log_size
        self._resources: dict[str, ResourceState] = {}
        # A store that starts above zero lost its history (restart without state).
        self._floor = start_rv

    def state(self, plural: str) -> ResourceState:
        st = self._resources.get(plural)
        if st is None:
            st = ResourceState(compacted=self._floor)
            self._resources[plural] = st
        return st

    def get(self, plural: str, key: Key) -> Obj | None:
        with self.cond:
            obj = self.state(plural).objects.get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def commit(self, plural: str, key: Key, new: Obj | None) -> Obj:
        """Write (or delete, when `new` is None) at the next revision; wake every watcher.

        Returns the stored object, or for a delete the last state with the deletion revision.
        """
        with self.cond:
            st = self.state(plural)
            old = st.objects.get(key)
            self.rv += 1
            if new is None:
                assert old is not None
                gone = copy.deepcopy(old)
                gone["metadata"]["resourceVersion"] = str(self.rv)
                del st.objects[key]
                st.owners.pop(key, None)
                event = Event(self.rv, "DELETED", key, gone, old)
                result = gone
            else:
                stored = copy.deepcopy(new)
                stored["metadata"]["resourceVersion"] = str(self.rv)
                st.objects[key] = stored
                event = Event(self.rv, "MODIFIED" if old else "ADDED", key, stored, old)
                result = stored
            st.log.append(event)
            while len(st.log) > self.log_size:
                st.compacted = st.log.popleft().rv
            self.cond.notify_all()
            return copy.deepcopy(result)

    def snapshot(self, plural: str, at: int | None = None) -> dict[Key, Obj]:
        """Objects as they were at revision `at` (now when None), rebuilt from the log."""
        with self.cond:
            st = self.state(plural)
            objects = dict(st.objects)
            if at is not None and at < self.rv:
                if at < st.compacted:
                    raise TooOldError(at, st.compacted + 1)
                for ev in reversed(st.log):
                    if ev.rv <= at:
                        break
                    if ev.old is None:
                        objects.pop(ev.key, None)
                    else:
                        objects[ev.key] = ev.old
            return {k: copy.deepcopy(v) for k, v in objects.items()}

    def events_after(self, plural: str, rv: int) -> list[Event]:
        """Events newer than `rv`, oldest first; TooOldError when the log starts after it."""
        with self.cond:
            st = self.state(plural)
            if rv < st.compacted:
                raise TooOldError(rv, st.compacted + 1)
            out: list[Event] = []
            for ev in reversed(st.log):
                if ev.rv <= rv:
                    break
                out.append(ev)
            out.reverse()
            return out

    def forget_history(self) -> None:
        """Make every revision up to now unreachable, as after a restore from nothing."""
        with self.cond:
            self._floor = self.rv
            for st in self._resources.values():
                st.log.clear()
                st.compacted = self.rv

    def plurals(self) -> Iterable[str]:
        return list(self._resources)
