"""The per-device state machine, driven with explicit times."""

from __future__ import annotations

from agent.health.model import Condition, HealthState, Kind
from agent.health.tracker import Tracker

XID79 = Condition(Kind.XID, "79", "Xid 79: GPU has fallen off the bus")
XID48 = Condition(Kind.XID, "48", "Xid 48: double-bit ECC error")
DOWN = Condition(Kind.LINK_DOWN, "carrier", "link down (carrier 0)")
BLIND = Condition(Kind.UNMONITORED, "", "no NVML events")


def tracker(quiet: float = 10.0, interval: float = 0.0) -> Tracker:
    t = Tracker(quiet, interval)
    t.set_devices(["gpu-0", "gpu-1", "nic-0"])
    t.evaluate(0.0)  # everything starts healthy
    return t


def state(t: Tracker, name: str) -> HealthState:
    return t.snapshot()[name].state


def test_devices_start_healthy_without_a_publish_worth_taints() -> None:
    t = Tracker(10, 5)
    t.set_devices(["gpu-0"])
    transitions, deadline = t.evaluate(0.0)
    assert [(tr.before, tr.after.state if tr.after else None) for tr in transitions] == [
        (None, HealthState.HEALTHY)]
    assert deadline is None


def test_event_is_unhealthy_at_once_and_heals_after_the_quiet_period() -> None:
    t = tracker(quiet=10)
    assert t.event(["gpu-0"], "gpu", XID79, 1.0) == ["gpu-0"]
    transitions, deadline = t.evaluate(1.0)
    assert [tr.after.device for tr in transitions if tr.after] == ["gpu-0"]
    assert state(t, "gpu-0") is HealthState.UNHEALTHY
    assert t.snapshot()["gpu-0"].conditions == (XID79,)
    assert t.snapshot()["gpu-0"].recovering  # an event is over as soon as it happened
    assert deadline == 11.0
    assert t.evaluate(10.9)[0] == []
    transitions, deadline = t.evaluate(11.0)
    assert state(t, "gpu-0") is HealthState.HEALTHY
    assert deadline is None
    assert t.snapshot()["gpu-0"].message == ""


def test_a_new_event_restarts_the_quiet_period_and_keeps_first_seen_order() -> None:
    t = tracker(quiet=10)
    t.event(["gpu-0"], "gpu", XID79, 1.0)
    t.event(["gpu-0"], "gpu", XID48, 5.0)
    t.evaluate(5.0)
    assert [c.value for c in t.snapshot()["gpu-0"].conditions] == ["79", "48"]
    t.evaluate(11.0)  # Xid 79 expired, 48 still in force
    assert [c.value for c in t.snapshot()["gpu-0"].conditions] == ["48"]
    t.evaluate(15.0)
    assert state(t, "gpu-0") is HealthState.HEALTHY


def test_level_holds_while_asserted_then_quiet_period_from_the_clear() -> None:
    t = tracker(quiet=10)
    t.levels("nic", {"nic-0": [DOWN]}, 1.0)
    t.evaluate(1.0)
    assert state(t, "nic-0") is HealthState.UNHEALTHY
    assert not t.snapshot()["nic-0"].recovering
    t.levels("nic", {"nic-0": [DOWN]}, 100.0)
    t.evaluate(100.0)  # still down: no expiry however long it lasts
    assert state(t, "nic-0") is HealthState.UNHEALTHY
    t.levels("nic", {}, 101.0)
    t.evaluate(101.0)
    assert t.snapshot()["nic-0"].recovering
    assert "quiet period" in t.snapshot()["nic-0"].message
    t.evaluate(110.9)
    assert state(t, "nic-0") is HealthState.UNHEALTHY
    t.evaluate(111.0)
    assert state(t, "nic-0") is HealthState.HEALTHY


def test_level_back_during_the_quiet_period_is_one_continuous_fault() -> None:
    t = tracker(quiet=10)
    assert t.levels("nic", {"nic-0": [DOWN]}, 1.0) == [("nic-0", DOWN)]
    t.levels("nic", {}, 2.0)
    assert t.levels("nic", {"nic-0": [DOWN]}, 3.0) == []  # not a new fault
    t.levels("nic", {}, 4.0)
    t.evaluate(13.9)
    assert state(t, "nic-0") is HealthState.UNHEALTHY
    t.evaluate(14.0)
    assert state(t, "nic-0") is HealthState.HEALTHY


def test_one_source_never_clears_another_sources_condition() -> None:
    t = tracker(quiet=0)
    t.levels("nic", {"gpu-0": [DOWN]}, 1.0)
    t.levels("gpu", {}, 1.0)
    t.evaluate(1.0)
    assert state(t, "gpu-0") is HealthState.UNHEALTHY


def test_unmonitored_has_no_quiet_period_and_a_fault_outranks_it() -> None:
    t = tracker(quiet=10)
    t.levels("gpu", {"gpu-1": [BLIND]}, 1.0)
    t.evaluate(1.0)
    assert state(t, "gpu-1") is HealthState.UNMONITORED
    t.event(["gpu-1"], "gpu", XID48, 2.0)
    t.evaluate(2.0)
    assert state(t, "gpu-1") is HealthState.UNHEALTHY
    assert [c.kind for c in t.snapshot()["gpu-1"].conditions] == [Kind.XID, Kind.UNMONITORED]
    t.levels("gpu", {}, 3.0)
    t.evaluate(12.0)
    assert state(t, "gpu-1") is HealthState.HEALTHY


def test_rate_limit_publishes_the_latest_state_at_the_end_of_the_window() -> None:
    t = tracker(quiet=0, interval=5)
    t.levels("nic", {"nic-0": [DOWN]}, 1.0)
    assert len(t.evaluate(1.0)[0]) == 1  # the first change goes out at once
    published = 1
    now = 1.0
    for _ in range(40):  # 10 Hz flap for 4 s
        now += 0.1
        up = round(now * 10) % 2 == 0
        t.levels("nic", {} if up else {"nic-0": [DOWN]}, now)
        transitions, deadline = t.evaluate(now)
        published += len(transitions)
        if up:  # a pending change waits for the window's end; nothing pending when down
            assert deadline == 6.0
    assert published == 1
    t.levels("nic", {}, now)  # the link settles up
    transitions, _ = t.evaluate(6.0)
    assert [tr.after.state for tr in transitions if tr.after] == [HealthState.HEALTHY]


def test_unknown_devices_are_ignored_and_removed_ones_leave_the_snapshot() -> None:
    t = tracker()
    assert t.event(["gpu-9"], "gpu", XID79, 1.0) == []
    t.set_devices(["gpu-0"])
    transitions, _ = t.evaluate(1.0)
    assert sorted(tr.before.device for tr in transitions if tr.before and not tr.after) == [
        "gpu-1", "nic-0"]
    assert set(t.snapshot()) == {"gpu-0"}


def test_expired_conditions_are_forgotten() -> None:
    t = tracker(quiet=1)
    for i in range(100):
        t.event(["gpu-0"], "gpu", Condition(Kind.XID, str(100 + i), "x"), float(i))
    t.evaluate(200.0)
    assert t.desired("gpu-0", 200.0).conditions == ()
    assert t._held["gpu-0"] == {}


def test_with_no_quiet_period_an_event_still_holds_for_one_publish() -> None:
    t = tracker(quiet=0)
    t.event(["gpu-0"], "gpu", XID79, 1.0)
    t.evaluate(1.0)
    assert state(t, "gpu-0") is HealthState.UNHEALTHY
    t.evaluate(1.9)
    assert state(t, "gpu-0") is HealthState.UNHEALTHY
    t.evaluate(2.0)
    assert state(t, "gpu-0") is HealthState.HEALTHY
