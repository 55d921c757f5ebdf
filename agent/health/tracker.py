"""The per-device health state machine, free of threads and clocks (``now`` is passed in).

Signals come in two shapes:

* **events** (an Xid, an ECC error): a point in time. The condition holds until no new event
  came for ``quiet_period_s`` (at least ``MIN_EVENT_HOLD_S``, so an event is always seen by
  one publish even with a zero quiet period).
* **levels** (link down, GPU lost, unmonitored): a source states, for every device it covers,
  which conditions are asserted right now. A condition no longer asserted starts its quiet
  period; asserted again, it is back in force and the quiet period starts over.

A device with any fault condition in force is unhealthy; with only ``unmonitored`` (which has
no quiet period: there is nothing to wait out) it is unmonitored; otherwise healthy.

Publishing is rate limited per device: a change is published at once when the device's last
published change is at least ``min_interval_s`` old, otherwise at the end of that window,
with whatever the state is by then. Flapping inside one window therefore costs one publish.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.health.model import KIND_ORDER, Condition, DeviceHealth, HealthState, Kind

_NEVER = -math.inf
MIN_EVENT_HOLD_S = 1.0


@dataclass
class _Held:
    condition: Condition
    source: str
    active: bool
    event: bool
    first_seen: float
    last_seen: float  # last time asserted (levels) or the event time (events)


@dataclass(frozen=True, slots=True)
class Transition:
    """A published change of one device (``before`` is None for a new device)."""

    before: DeviceHealth | None
    after: DeviceHealth | None  # None: the device left the inventory


class Tracker:
    def __init__(self, quiet_period_s: float, min_interval_s: float) -> None:
        self.quiet_period_s = quiet_period_s
        self.min_interval_s = min_interval_s
        self._held: dict[str, dict[tuple[str, Kind, str], _Held]] = {}
        self._published: dict[str, DeviceHealth] = {}
        self._published_at: dict[str, float] = {}

    # -- inputs ----------------------------------------------------------------------------

    def set_devices(self, names: Iterable[str]) -> None:
        """The inventory's device names; state of devices that left is dropped."""
        wanted = set(names)
        for gone in set(self._held) - wanted:
            del self._held[gone]
        for name in wanted:
            self._held.setdefault(name, {})

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(self._held)

    def event(self, devices: Iterable[str], source: str, condition: Condition,
              now: float) -> list[str]:
        """A point event on ``devices``; returns the devices it applied to (known ones)."""
        hit = []
        for name in devices:
            held = self._held.get(name)
            if held is None:
                continue
            key = (source, condition.kind, condition.value)
            old = held.get(key)
            first = old.first_seen if old is not None and self._in_force(old, now) else now
            held[key] = _Held(condition, source, False, True, first, now)
            hit.append(name)
        return hit

    def levels(self, source: str, asserted: Mapping[str, Sequence[Condition]],
               now: float) -> list[tuple[str, Condition]]:
        """``source`` asserts exactly these conditions now, on the devices it names and on
        no other device. Returns the newly raised (device, condition) pairs."""
        raised: list[tuple[str, Condition]] = []
        for name, held in self._held.items():
            current = {(source, c.kind, c.value): c for c in asserted.get(name, ())}
            for key, h in held.items():
                if h.source == source and h.active and key not in current:
                    h.active = False
                    h.last_seen = now  # the quiet period starts when the signal cleared
            for key, cond in current.items():
                old = held.get(key)
                if old is not None and (old.active or self._in_force(old, now)):
                    old.condition, old.active, old.last_seen = cond, True, now
                    continue
                held[key] = _Held(cond, source, True, False, now, now)
                raised.append((name, cond))
        return raised

    # -- evaluation ------------------------------------------------------------------------

    def _quiet(self, held: _Held) -> float:
        if held.condition.kind is Kind.UNMONITORED:
            return 0.0  # nothing to wait out: monitoring works again or it does not
        if held.event:
            return max(self.quiet_period_s, MIN_EVENT_HOLD_S)
        return self.quiet_period_s

    def _in_force(self, held: _Held, now: float) -> bool:
        return held.active or now - held.last_seen < self._quiet(held)

    def desired(self, name: str, now: float) -> DeviceHealth:
        held = self._held.get(name, {})
        live = sorted(
            (h for h in held.values() if self._in_force(h, now)),
            key=lambda h: (KIND_ORDER[h.condition.kind], h.first_seen, h.condition.value),
        )
        # Drop what expired so the maps do not grow with every Xid ever seen.
        for key in [k for k, h in held.items() if not self._in_force(h, now)]:
            del held[key]
        faults = [h for h in live if h.condition.kind is not Kind.UNMONITORED]
        if faults:
            state = HealthState.UNHEALTHY
        elif live:
            state = HealthState.UNMONITORED
        else:
            state = HealthState.HEALTHY
        conditions: list[Condition] = []
        for h in live:  # one entry per (kind, value) even when two sources agree
            if all((c.kind, c.value) != (h.condition.kind, h.condition.value) for c in conditions):
                conditions.append(h.condition)
        recovering = bool(faults) and not any(h.active for h in faults)
        return DeviceHealth(name, state, tuple(conditions), recovering)

    def evaluate(self, now: float) -> tuple[list[Transition], float | None]:
        """Publish what may be published now. Returns the transitions and the next time
        something may change without a new signal (quiet period ends, rate window ends)."""
        transitions: list[Transition] = []
        deadline: float | None = None

        def later(t: float) -> None:
            nonlocal deadline
            deadline = t if deadline is None else min(deadline, t)

        for gone in set(self._published) - set(self._held):
            transitions.append(Transition(self._published.pop(gone), None))
            self._published_at.pop(gone, None)
        for name in sorted(self._held):
            want = self.desired(name, now)
            for h in self._held[name].values():
                if not h.active:
                    later(h.last_seen + self._quiet(h))
            have = self._published.get(name)
            if have == want:
                continue
            if have is None:
                self._published[name] = want
                if want.state is not HealthState.HEALTHY:
                    self._published_at[name] = now
                transitions.append(Transition(None, want))
                continue
            ready_at = self._published_at.get(name, _NEVER) + self.min_interval_s
            if now >= ready_at:
                self._published[name] = want
                self._published_at[name] = now
                transitions.append(Transition(have, want))
            else:
                later(ready_at)
        return transitions, deadline

    def snapshot(self) -> dict[str, DeviceHealth]:
        return dict(self._published)
