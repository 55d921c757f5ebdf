"""The watch scopes a controller runs, and where each of its slices lives.

A scope is one field selector with its own store and watcher thread (watch.py). Node-local
pools live in ``spec.driver=D,spec.nodeName=N``; pools with a node selector (or published
for all nodes) in ``spec.driver=D,spec.nodeName=``, which is started only once such a pool
exists. A scope, once started, runs until the controller stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from agent.slices.owner import Owner, accept_all, owned_by
from agent.slices.watch import Scope


class Scopes:
    """Thread-safe registry of scopes; ``start_watcher`` runs the thread of a new one."""

    def __init__(
        self, driver: str, owner: Owner | None, start_watcher: Callable[[Scope], None]
    ) -> None:
        self._driver = driver
        self._owner = owner
        self._start_watcher = start_watcher
        self._lock = threading.Lock()
        self._scopes: dict[str, Scope] = {}

    def selector(self, node_name: str | None) -> str:
        return f"spec.driver={self._driver},spec.nodeName={node_name or ''}"

    def ensure(self, node_names: Iterable[str | None]) -> None:
        """Start a scope for each node name (None: node-less) that has none yet."""
        owner = self._owner
        for node in sorted(set(node_names), key=lambda n: n or ""):
            selector = self.selector(node)
            with self._lock:
                if selector in self._scopes:
                    continue
                # Node-less slices are shared by every node's agent: ours carry our owner.
                accepts = owned_by(owner) if node is None and owner is not None else accept_all
                scope = self._scopes[selector] = Scope(selector, accepts)
            self._start_watcher(scope)

    def all(self) -> list[Scope]:
        with self._lock:
            return list(self._scopes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._scopes)

    def for_node(self, node_name: str | None) -> Scope | None:
        with self._lock:
            return self._scopes.get(self.selector(node_name))

    def listed(self, node_name: str | None) -> bool:
        scope = self.for_node(node_name)
        return scope is not None and scope.listed

    def any_listed(self) -> bool:
        return any(s.listed for s in self.all())

    def all_listed(self) -> bool:
        return all(s.listed for s in self.all())

    def holding(self, pool: str, name: str) -> Scope | None:
        for scope in self.all():
            if any(o.get("metadata", {}).get("name") == name for o in scope.store.pool(pool)):
                return scope
        return None

    def existing(self, pool: str) -> list[dict[str, Any]]:
        """Every stored slice of ``pool``, from all scopes (a pool may be moving)."""
        return [obj for scope in self.all() for obj in scope.store.pool(pool)]

    def interrupt(self, relist: bool = False) -> None:
        for scope in self.all():
            if relist:
                scope.relist_requested = True
            scope.interrupt()
