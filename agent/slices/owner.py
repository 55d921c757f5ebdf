"""Who the slices belong to, and how to recognise ours among shared node-less slices."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.slices.api import ApiError
from agent.slices.backoff import Backoff
from agent.slices.sync import OwnerRef, PoolPlan, owner_ok

log = logging.getLogger("agent.slices")


@dataclass(frozen=True, slots=True)
class Owner:
    """The object the slices belong to; a Node owner also sets ``spec.nodeName``.

    ``uid`` None: the Node is looked up once (needs RBAC ``get nodes``). With a Node owner the
    garbage collector deletes the slices together with the Node.
    """

    kind: str = "Node"
    name: str = ""
    uid: str | None = None
    api_version: str = "v1"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Owner needs a name (the node name for a Node owner)")

    @property
    def is_node(self) -> bool:
        return self.kind == "Node" and self.api_version == "v1"


Filter = Callable[[Mapping[str, Any]], bool]


def accept_all(obj: Mapping[str, Any]) -> bool:
    return True


def owned_by(owner: Owner) -> Filter:
    """Node-less slices of a driver are shared by every node's agent: ours carry our owner."""

    def accepts(obj: Mapping[str, Any]) -> bool:
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any(
            isinstance(r, Mapping) and r.get("controller") is True
            and r.get("kind") == owner.kind and r.get("name") == owner.name
            for r in refs
        )

    return accepts


#: How long a Node UID the caller read stands for a lookup of the first batch of syncs.
SEED_TRUSTED_S = 30.0


class OwnerUID:
    """The owner reference to write, with a looked-up Node UID kept fresh enough.

    The UID of a looked-up Node is cached, but a Node can be deleted and registered again
    under the same name with a new UID (an API server restored empty, a node re-joined), and
    slices carrying the old UID would be deleted by the garbage collector. ``stale`` tells
    from a planned sync when that may have happened, so a steady state costs no Node GET.
    Used by the controller's worker thread only.
    """

    def __init__(
        self,
        owner: Owner | None,
        lookup: Callable[[str], str],
        backoff: Backoff,
        clock: Callable[[], float] = time.monotonic,
        *,
        known: str | None = None,
    ) -> None:
        self._owner = owner
        self._lookup = lookup  # Node name -> UID; raises ApiError
        self._backoff = backoff
        self._clock = clock
        self._uid = owner.uid if owner is not None else None
        #: Looked up in the current batch of syncs: at most one GET per batch of pools.
        self._fresh = False
        #: ``known``: the Node's UID as the daemon read it at start, a moment before the first
        #: batch: the first batch that syncs a pool within ``SEED_TRUSTED_S`` takes it as
        #: looked up (no second GET of the same Node at start); later ones check it as any
        #: looked-up UID.
        self._seed_until: float | None = None
        if self._uid is None and known:
            self._uid, self._seed_until = known, clock() + SEED_TRUSTED_S
        #: A lookup could not confirm the cached UID: the next sync looks again.
        self._suspect = False
        #: When to look again for a Node that was not found; None: no need.
        self.recheck_at: float | None = None

    def new_batch(self, syncs: bool = True) -> None:
        """A batch of syncs begins (``syncs`` False: a round with no pool due)."""
        seeded = self._seed_until is not None and self._clock() < self._seed_until
        self._fresh = syncs and seeded
        if syncs or not seeded:
            self._seed_until = None

    def ref(self, refresh: bool = False) -> OwnerRef | None:
        """Our owner reference; a Node's UID is looked up when unknown, or again on ``refresh``.

        A refresh that finds no Node (deleted, not registered again yet) keeps the UID we had
        and sets ``recheck_at`` after a back-off, so the pool stays published meanwhile; any
        other failure raises, and the retried sync refreshes again.
        """
        owner = self._owner
        if owner is None:
            return None
        if self._uid is None or refresh:
            previous = self._uid
            self._fresh = True
            try:
                uid = self._lookup(owner.name)
            except ApiError as err:
                if previous is None:
                    raise
                self._suspect = True
                if not err.not_found:
                    raise
                self.recheck_at = self._clock() + self._backoff.next()
                log.warning("node owner not found; keeping its last known uid",
                            extra={"node": owner.name, "uid": previous})
                return OwnerRef(owner.api_version, owner.kind, owner.name, previous)
            self._uid = uid
            self._suspect = False
            self._backoff.reset()
            self.recheck_at = None
            if uid != previous:
                log.info("node owner found",
                         extra={"node": owner.name, "uid": uid, "previous": previous})
        assert self._uid is not None
        return OwnerRef(owner.api_version, owner.kind, owner.name, self._uid)

    def stale(
        self, plan: PoolPlan, existing: Sequence[Mapping[str, Any]], ref: OwnerRef | None
    ) -> bool:
        """Whether to look the Node up again before writing ``plan``: it creates slices (ours
        vanished: an empty server, a kubelet wipe), the stored slices carry another owner UID,
        or the last lookup could not confirm ours. Never for a UID the caller gave."""
        if ref is None or self._owner is None or self._owner.uid is not None or self._fresh:
            return False
        return (
            self._suspect
            or bool(plan.creates)
            or any(not owner_ok(obj, ref) for obj in existing)
        )
