"""Option parsing (bad input included), the Xid table and taints on inventory devices."""

from __future__ import annotations

import pytest

from agent.health import (
    DEFAULT_IGNORED_XIDS,
    Condition,
    DeviceHealth,
    HealthConfigError,
    HealthOptions,
    HealthState,
    Kind,
    apply_taints,
    describe_xid,
    parse_effects,
    parse_xids,
)
from discovery.model import Device, DeviceType, Inventory, Taint

DRIVER = "dra-agent.io"


def test_default_ignore_list_is_the_nvidia_drivers() -> None:
    assert sorted(DEFAULT_IGNORED_XIDS) == [13, 31, 43, 45, 68, 109]
    assert HealthOptions().ignored_xids == DEFAULT_IGNORED_XIDS


def test_xid_messages() -> None:
    assert describe_xid(79) == "Xid 79: GPU has fallen off the bus"
    assert describe_xid(48) == "Xid 48: double-bit ECC error"
    assert describe_xid(999) == "Xid 999: critical GPU error (see the NVIDIA Xid catalogue)"


def test_parse_xids() -> None:
    assert parse_xids("13, 31,,43 ") == {13, 31, 43}
    assert parse_xids(["63", "64"]) == {63, 64}
    assert parse_xids("") == frozenset()


@pytest.mark.parametrize("text, needle", [
    ("13,abc", "'abc' is not a number"),
    ("0", "must be positive"),
    ("-5", "must be positive"),
    ("0x4f", "not a number"),
])
def test_bad_xid_lists_are_refused(text: str, needle: str) -> None:
    with pytest.raises(HealthConfigError, match=needle):
        parse_xids(text)


def test_parse_effects_overrides_the_defaults() -> None:
    effects = parse_effects("xid=NoExecute, unmonitored=off")
    assert effects[Kind.XID] == "NoExecute"
    assert effects[Kind.UNMONITORED] is None
    assert effects[Kind.LINK_DOWN] == "NoSchedule"
    assert HealthOptions(effects=effects).effect(Kind.XID) == "NoExecute"


@pytest.mark.parametrize("text, needle", [
    ("xid", "is not KIND=EFFECT"),
    ("fan=NoSchedule", "unknown health condition 'fan'"),
    ("xid=PreferNoSchedule", "is not one of None, NoSchedule, NoExecute, off"),
    ("xid=noschedule", "is not one of"),
])
def test_bad_effects_are_refused(text: str, needle: str) -> None:
    with pytest.raises(HealthConfigError, match=needle):
        parse_effects(text)


@pytest.mark.parametrize("kw, needle", [
    ({"effects": {Kind.XID: "Evict"}}, "taint effect 'Evict'"),
    ({"quiet_period_s": -1}, "quiet_period_s must not be negative"),
    ({"nic_poll_s": 0}, "must be positive"),
    ({"nic_backstop_s": 0}, "must be positive"),
    ({"nic_backstop_s": -5}, "nic_backstop_s must not be negative"),
    ({"gpu_wait_ms": 0}, "must be positive"),
])
def test_bad_options_are_refused(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(HealthConfigError, match=needle):
        HealthOptions(**kw)  # type: ignore[arg-type]


def test_defaults_never_evict() -> None:
    options = HealthOptions()
    assert {options.effect(k) for k in Kind} == {"NoSchedule", "None"}
    assert options.effect(Kind.UNMONITORED) == "None"


def _inventory() -> Inventory:
    foreign = Taint("admin.example.com/maintenance", "NoSchedule", "yes")
    return Inventory(devices=(
        Device("gpu-0", DeviceType.GPU, {}, {}),
        Device("gpu-1", DeviceType.GPU, {}, {}, taints=(foreign,)),
        Device("nic-0", DeviceType.NIC, {}, {}),
    ))


def test_taints_one_per_kind_first_condition_wins_foreign_taints_kept() -> None:
    health = {
        "gpu-0": DeviceHealth("gpu-0", HealthState.UNHEALTHY, (
            Condition(Kind.GPU_LOST, "", "lost"),
            Condition(Kind.XID, "79", "Xid 79"),
            Condition(Kind.XID, "48", "Xid 48"),
        )),
        "gpu-1": DeviceHealth("gpu-1", HealthState.UNMONITORED, (
            Condition(Kind.UNMONITORED, "", "no events"),)),
        "nic-0": DeviceHealth("nic-0"),
    }
    out = apply_taints(_inventory(), health, DRIVER, HealthOptions()).by_name()
    assert [t.to_api() for t in out["gpu-0"].taints] == [
        {"key": "dra-agent.io/gpu-lost", "effect": "NoSchedule"},
        {"key": "dra-agent.io/xid", "effect": "NoSchedule", "value": "79"},
    ]
    assert [t.key for t in out["gpu-1"].taints] == [
        "admin.example.com/maintenance", "dra-agent.io/unmonitored"]
    assert out["gpu-1"].taints[1].effect == "None"
    assert out["nic-0"].taints == ()


def test_recovered_device_loses_only_our_taints_and_unchanged_inventory_is_reused() -> None:
    inv = _inventory()
    sick = {"gpu-1": DeviceHealth("gpu-1", HealthState.UNHEALTHY, (
        Condition(Kind.LINK_DOWN, "carrier", "down"),))}
    tainted = apply_taints(inv, sick, DRIVER, HealthOptions())
    assert len(tainted.by_name()["gpu-1"].taints) == 2
    healed = apply_taints(tainted, {"gpu-1": DeviceHealth("gpu-1")}, DRIVER, HealthOptions())
    assert healed.by_name()["gpu-1"].taints == inv.by_name()["gpu-1"].taints
    assert apply_taints(inv, {}, DRIVER, HealthOptions()) is inv


def test_kind_with_effect_off_publishes_no_taint() -> None:
    health = {"nic-0": DeviceHealth("nic-0", HealthState.UNHEALTHY, (
        Condition(Kind.LINK_DOWN, "carrier", "down"),))}
    options = HealthOptions(effects=parse_effects("link-down=off"))
    assert apply_taints(_inventory(), health, DRIVER, options).by_name()["nic-0"].taints == ()
