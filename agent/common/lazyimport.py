"""Modules that load on their first use instead of when imported (``importlib.util.LazyLoader``).

gRPC's package imports ``grpc.aio`` and its extension imports ``asyncio``; a sync server never
uses either, yet the two are about 170 M of the 250 M instructions ``import grpc`` costs, a
sixth of what ``dra-agent run`` ran before the kubelet's registration answered. Imported
lazily, each is a module object whose code runs at the first attribute read, so nothing can
observe the difference but the time: whoever really uses asyncio gets all of it, then.

The one caveat is Python 3.11's LazyLoader itself: two threads reading a lazy module's first
attribute at the same moment may see it half loaded (fixed in 3.12). Nothing in the agent
uses asyncio or ``grpc.aio`` (tests/daemon checks that a started agent has loaded neither),
so nothing reads them at all.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

#: What ``dra-agent run`` defers (see the module's docstring).
UNUSED_BY_THE_SYNC_SERVER = ("asyncio", "grpc.aio")


class _Lazy:
    """A meta path finder (the protocol, not ``importlib.abc``'s class: that module loads
    ``importlib.resources`` and ``tempfile``, a tenth of what this saves)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer(names: Iterable[str] = UNUSED_BY_THE_SYNC_SERVER) -> None:
    """Import ``names`` lazily from now on; those already imported stay as they are."""
    pending = [n for n in names if n not in sys.modules]
    if pending and not any(isinstance(f, _Lazy) for f in sys.meta_path):
        sys.meta_path.insert(0, _Lazy(pending))


def loaded(name: str) -> bool:
    """Whether ``name``'s code has run (False while it is a lazy module not yet read)."""
    module = sys.modules.get(name)
    # A lazy module is of LazyLoader's subclass until read, then a plain module.
    return module is not None and type(module) is ModuleType
