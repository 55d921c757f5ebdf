"""One shape for every change prepare makes to the host beyond the claim's CDI spec.

A MIG partition, a VF's driver, MAC and rate cap, a GPU's time slice, MPS client settings and
the device metadata files are each an ``Effect``. The preparer walks an ordered tuple of them
(``agent.daemon.wiring`` builds it) and knows none by name: a new kind of host change is one
module and one line in the wiring, never another ``if`` in prepare, unprepare, rewrite and
recovery.

The life of an effect, as NVIDIA's driver shapes each config's ``apply``:

* ``plan``: pure, before anything is written; may change the claim's spec devices (env,
  mounts) and its provisional record. A claim that cannot be prepared fails here.
* ``check``: under the checkpoint's lock, against every other prepared claim, just before the
  PrepareStarted record reserves the claim's devices (one GPU, one interval).
* ``apply``: the change itself. What it will change is written to the record and saved
  (``Step.save``, durably) *before* it changes it, so the rollback of a failed prepare and
  start-up after a kill -9 find every change by the record alone.
* ``reapply``: a prepared claim's spec is written again (a reboot, a lost spec): make the change
  hold again (a reboot dropped VFs and time slices) from the record, without a save: until the
  rewritten record is stored, the next start-up does this again, and finds it done.
* ``release``: at unprepare, and when a prepare that never completed is rolled back; exactly
  what the record names. ``released`` runs once the record has left the checkpoint.
* ``reconcile``: at start-up, after the rollback of interrupted prepares: the host made to
  agree with the completed records (a MIG partition a reboot dropped comes back; a file no
  record names goes).

Every method has a no-op default in ``BaseEffect``, so an effect implements only its stages.

**An effect never trusts a checkpoint field it has not checked against what discovery sees
now.** The checkpoint's checksum guards integrity, not authenticity, so before any host write
an effect checks every host object the record names (a VF's address is a published VF's, its
driver one the kernel has, a MIG instance one the record names by its ids on a published GPU)
and leaves anything else alone, in one line (``refused``). A *recovered* record (salvaged from
a corrupt file, adopted from a spec, unreadable) reaches no effect's ``release``, ``released``
or ``reconcile`` at all: it only keeps its devices taken (``left_alone`` says what stays).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import AllocatedDevice, Claim, ClaimRef
from agent.prepare.devices import SpecDevice

log = logging.getLogger(__name__)


class Save(Protocol):
    """Store the claim's record now; ``durable``: fsynced before it returns."""

    def __call__(self, record: ClaimRecord, durable: bool = True) -> None: ...


def no_save(record: ClaimRecord, durable: bool = True) -> None:
    """The ``Save`` of a rewrite: nothing to make durable first (see ``Effect.reapply``)."""


@dataclass(slots=True)
class Step:
    """One claim on its way through the effects, at prepare or at a rewrite."""

    claim: Claim
    results: Sequence[AllocatedDevice]
    #: The record as it stands: each effect adds what it will change, then what it made.
    record: ClaimRecord
    #: The claim's devices as its CDI spec will name them.
    devices: list[SpecDevice]
    #: This node's pool: the record's devices are named in it.
    pool: str
    save: Save = no_save
    #: True at a rewrite of a prepared claim (``reapply``), False at its first prepare.
    rewrite: bool = False
    #: What an effect's ``plan`` hands its own ``apply`` for this claim, by effect name.
    planned: dict[str, object] = field(default_factory=dict)

    @property
    def ref(self) -> ClaimRef:
        return self.claim.ref


@dataclass(slots=True)  # not frozen: built on every unprepare, and never changed
class Release:
    """What a release is undoing."""

    #: The claim's UID.
    uid: str
    #: None: an unprepare of a claim with no record (never prepared here, or its prepare
    #: failed before one was written); only what ``ref`` names by itself can go.
    record: ClaimRecord | None
    #: A prepare that never completed: its pod never ran (nothing it set to reset).
    rollback: bool
    #: The other prepared claims' records, read when called (an interval another share
    #: still asks for stays).
    remaining: Callable[[], Mapping[str, ClaimRecord]]
    #: The claim as the kubelet names it at unprepare, for the very UID unprepared (None at
    #: a rollback or start-up).
    ref: ClaimRef | None = None
    #: This boot's ID ("" when unknown): a record of another boot names nothing a reboot
    #: clears (a MIG instance).
    boot_id: str = ""

    @property
    def claim(self) -> str:
        """The claim as log lines and errors name it (``ns/name (uid)``, or the UID alone)."""
        return str(self.ref) if self.ref is not None else self.uid


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What an effect's start-up reconcile did."""

    #: Records to store again: what the host holds for them now (new MIG ids, ...).
    records: tuple[ClaimRecord, ...] = ()
    #: Host objects no record explained, removed (for the recovery report).
    removed: tuple[str, ...] = ()


class Effect(Protocol):
    """One kind of host change; see the module docstring for when each method runs."""

    #: Short, stable: log lines, the recovery report, ``Step.planned``.
    name: str
    #: What an operator does by hand when undoing it fails (one clause, for the log line).
    manual_fix: str

    def touches(self, record: ClaimRecord) -> bool:
        """The record names something of this effect (so release and reconcile have work)."""
        ...

    def plan(self, step: Step) -> None: ...

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None: ...

    def apply(self, step: Step) -> None: ...

    def reapply(self, step: Step) -> None: ...

    def stale(self, record: ClaimRecord) -> bool:
        """What the effect made for a completed claim is gone and a rewrite brings it back."""
        ...

    def release(self, how: Release) -> None:
        """Undo what ``how.record`` names; a ``ClaimError`` when the host refuses (the
        kubelet retries an unprepare; a rollback keeps the record for start-up)."""
        ...

    def released(self, record: ClaimRecord,
                 remaining: Callable[[], Mapping[str, ClaimRecord]]) -> None:
        """The record has left the checkpoint; ``remaining`` reads the others' records (only
        an effect that needs them pays for the read)."""
        ...

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        """Start-up, after interrupted prepares were rolled back; ``corrupt``: the checkpoint
        was just found corrupt (what no record names may still be a claim's)."""
        ...


class BaseEffect:
    """No-op stages: an effect overrides the ones it has."""

    name = "effect"
    manual_fix = "see the log line above"

    def touches(self, record: ClaimRecord) -> bool:
        return False

    def plan(self, step: Step) -> None:
        return None

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None:
        return None

    def apply(self, step: Step) -> None:
        return None

    def reapply(self, step: Step) -> None:
        """By default what ``apply`` does: with ``Step.save`` a no-op, the same steps make
        the change hold again."""
        self.apply(step)

    def stale(self, record: ClaimRecord) -> bool:
        return False

    def release(self, how: Release) -> None:
        return None

    def released(self, record: ClaimRecord,
                 remaining: Callable[[], Mapping[str, ClaimRecord]]) -> None:
        return None

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        return Reconciled()


def refused(claim: str, device: str, what: str, why: str) -> None:
    """The one line of a host object a record names that its effect will not touch."""
    log.warning("a checkpoint record names a host object this node does not publish as "
                "the claim's; left alone", extra={"claim": claim, "device": device,
                                                  "field": what, "why": why})


def left_alone(effects: Sequence[Effect], record: ClaimRecord, when: str) -> None:
    """The one line of a recovered record that names host changes: none is undone (nor made
    again), its devices stay taken until the claim is unprepared; each effect's manual fix."""
    touched = [e for e in effects if e.touches(record)]
    if touched:
        log.warning("a recovered checkpoint record names host changes; they are left as "
                    "they are", extra={
                        "claim": record.uid, "when": when,
                        "effects": ",".join(e.name for e in touched),
                        "by_hand": "; ".join(e.manual_fix for e in touched)})


def reversed_effects(effects: Sequence[Effect]) -> Sequence[Effect]:
    """Release order: the last change made is the first undone."""
    return tuple(reversed(effects))
