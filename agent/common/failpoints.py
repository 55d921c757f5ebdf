"""Failpoints: named places in prepare and unprepare where a crash test can strike.

The agent reads ``DRA_AGENT_FAILPOINTS`` once at start::

    DRA_AGENT_FAILPOINTS="prepare-after-spec-written=kill,unprepare-after-started=sleep:200"

and hands the resulting ``Failpoints`` to the preparer and the plugin framework. Actions:

* ``kill``: SIGKILL to this very process, a real ``kill -9`` (no cleanup, no flush, no
  ``finally``), which is what a crash test needs to prove the checkpoint and the CDI directory
  recover;
* ``error``: raise ``FailpointError`` (the claim's answer becomes an error);
* ``sleep:<ms>``: stall, to widen a race window.

Unset (the default everywhere), callers hold ``None`` and a point costs one ``is None`` check.
An unknown point or action is an error at start: a typo must not silently turn a crash test
into a test of nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger(__name__)

ENV = "DRA_AGENT_FAILPOINTS"


class Point(StrEnum):
    PREPARE_AFTER_CLAIM_GET = "prepare-after-claim-get"
    PREPARE_AFTER_STARTED = "prepare-after-started"  # PrepareStarted is in the checkpoint
    PREPARE_AFTER_SPEC_WRITTEN = "prepare-after-spec-written"
    PREPARE_AFTER_COMPLETED = "prepare-after-completed"  # PrepareCompleted is durable
    PREPARE_BEFORE_ANSWER = "prepare-before-answer"
    UNPREPARE_AFTER_STARTED = "unprepare-after-started"  # claim locked, nothing removed yet
    UNPREPARE_AFTER_SPEC_REMOVED = "unprepare-after-spec-removed"
    UNPREPARE_AFTER_COMPLETED = "unprepare-after-completed"  # record gone from the checkpoint
    UNPREPARE_BEFORE_ANSWER = "unprepare-before-answer"
    # Dynamic MIG partitions (agent.prepare.effects.mig).
    MIG_AFTER_INTENT = "mig-after-intent"  # the partition's intent is durable, nothing made
    MIG_AFTER_GI_CREATED = "mig-after-gi-created"  # GPU instance made, no compute instance
    MIG_AFTER_IDS_RECORDED = "mig-after-ids-recorded"  # both made, ids in the record (memory)
    MIG_AFTER_DESTROYED = "mig-after-destroyed"  # unprepare destroyed them, record still there
    # VFs on demand (agent.prepare.effects.vfs).
    VF_AFTER_INTENT = "vf-after-intent"  # the drivers to restore are recorded, none rebound
    VF_AFTER_BOUND = "vf-after-bound"  # the claim's VFs are on their new drivers
    # GPU passthrough (agent.prepare.effects.passthrough).
    GPU_VFIO_AFTER_INTENT = "gpu-vfio-after-intent"  # the drivers to restore are recorded
    GPU_VFIO_AFTER_BOUND = "gpu-vfio-after-bound"  # the claim's GPUs are on vfio-pci
    # Shares (agent.prepare.effects.timeslice).
    TIME_SLICE_AFTER_SET = "time-slice-after-set"  # the GPU's interval set, no spec yet


#: Shorter spellings accepted in the variable (the issue's own example uses the first).
ALIASES = {"prepare-after-get": Point.PREPARE_AFTER_CLAIM_GET}


class FailpointConfigError(ValueError):
    """``DRA_AGENT_FAILPOINTS`` cannot be parsed; names the entry and what is allowed."""


class FailpointError(RuntimeError):
    """The ``error`` action fired."""

    def __init__(self, point: Point) -> None:
        super().__init__(f"failpoint {point}: injected error")
        self.point = point


class Kind(StrEnum):
    KILL = "kill"
    ERROR = "error"
    SLEEP = "sleep"


@dataclass(frozen=True, slots=True)
class Action:
    kind: Kind
    sleep_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> Action:
        name, _, arg = text.partition(":")
        if name == Kind.SLEEP:
            if not arg.isdigit():
                raise FailpointConfigError(f"{text!r}: sleep needs milliseconds, e.g. sleep:250")
            return cls(Kind.SLEEP, int(arg))
        if name in (Kind.KILL, Kind.ERROR) and not arg:
            return cls(Kind(name))
        raise FailpointConfigError(f"{text!r}: unknown action (kill, error, sleep:<ms>)")


class Failpoints:
    """The enabled points and their actions; ``hits`` counts how often each point was hit."""

    def __init__(self, actions: Mapping[Point, Action]) -> None:
        self.actions = dict(actions)
        self.hits: Counter[Point] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, text: str) -> Failpoints:
        """``point=action[,point=action...]``; empty entries are ignored."""
        actions: dict[Point, Action] = {}
        known = ", ".join(p.value for p in Point)
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            name, sep, action = entry.partition("=")
            name = name.strip()
            if not sep:
                raise FailpointConfigError(f"{entry!r}: expected <point>=<action>")
            point = ALIASES.get(name)
            if point is None:
                try:
                    point = Point(name)
                except ValueError:
                    raise FailpointConfigError(
                        f"{name!r}: unknown failpoint (known: {known})"
                    ) from None
            if point in actions:
                raise FailpointConfigError(f"{point}: given twice")
            actions[point] = Action.parse(action.strip())
        return cls(actions)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Failpoints | None:
        """The failpoints ``environ`` enables, or None (the normal case: zero cost)."""
        text = environ.get(ENV, "").strip()
        if not text:
            return None
        points = cls.parse(text)
        if not points.actions:
            return None
        log.warning(
            "failpoints enabled: this agent will crash or fail on purpose",
            extra={"failpoints": ",".join(f"{p}={a.kind}" for p, a in points.actions.items())},
        )
        return points

    def hit(self, point: Point, claim: str = "") -> None:
        """Run ``point``'s action, if it has one."""
        action = self.actions.get(point)
        with self._lock:
            self.hits[point] += 1
        if action is None:
            return
        log.warning("failpoint hit", extra={"failpoint": str(point), "action": str(action.kind),
                                            "claim": claim})
        if action.kind is Kind.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # SIGKILL is asynchronous only in theory; never run on
        elif action.kind is Kind.ERROR:
            raise FailpointError(point)
        else:
            time.sleep(action.sleep_ms / 1000)


def hit(failpoints: Failpoints | None, point: Point, claim: str = "") -> None:
    """``failpoints.hit(point)`` when failpoints are enabled; nothing otherwise."""
    if failpoints is not None:
        failpoints.hit(point, claim)
