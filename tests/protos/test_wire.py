"""Each message encodes to the bytes a kubelet built from upstream expects.

The expected bytes are written by hand from the field tables (field number, wire type), so a
wrong number, type or label in our .proto cannot pass. Both directions are checked: our encoding
equals the hand bytes, and the hand bytes parse back to the same message.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf.message import Message

from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.drahealth.v1alpha1 import api_pb2 as health
from protos.pluginregistration import api_pb2 as reg
from tests.protos.wire import int_field, len_field, map_entry, str_field

DRA = [v1, v1beta1]


def assert_wire(msg: Message, expected: bytes) -> None:
    assert msg.SerializeToString(deterministic=True) == expected
    back = type(msg)()
    back.ParseFromString(expected)
    assert back == msg


# --- pluginregistration ------------------------------------------------------------------


def test_plugin_info() -> None:
    msg = reg.PluginInfo(
        type="DRAPlugin",
        name="dra-agent.io",
        endpoint="/var/lib/kubelet/plugins/dra-agent.io/dra.sock",
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    expected = (
        str_field(1, "DRAPlugin")
        + str_field(2, "dra-agent.io")
        + str_field(3, "/var/lib/kubelet/plugins/dra-agent.io/dra.sock")
        + str_field(4, "v1.DRAPlugin")
        + str_field(4, "v1beta1.DRAPlugin")
    )
    assert_wire(msg, expected)


def test_plugin_info_literal_bytes() -> None:
    # Spelled out once without the helper: tag 0x0a = field 1 LEN, 0x12 = 2, 0x1a = 3, 0x22 = 4.
    msg = reg.PluginInfo(type="T", name="n", endpoint="/e", supported_versions=["a", "b"])
    assert_wire(msg, b"\x0a\x01T\x12\x01n\x1a\x02/e\x22\x01a\x22\x01b")


def test_registration_status() -> None:
    assert_wire(
        reg.RegistrationStatus(plugin_registered=True, error="late"),
        b"\x08\x01" + b"\x12\x04late",
    )
    # proto3 scalars without presence: false and "" are not written at all.
    assert_wire(reg.RegistrationStatus(plugin_registered=False, error=""), b"")


def test_empty_registration_messages() -> None:
    assert_wire(reg.InfoRequest(), b"")
    assert_wire(reg.RegistrationStatusResponse(), b"")
    # An empty message must still accept (and skip) fields a newer kubelet might add.
    parsed = reg.InfoRequest()
    parsed.ParseFromString(str_field(7, "future"))
    assert parsed.ByteSize() > 0


# --- DRA node service, v1 and v1beta1 ----------------------------------------------------


def claim_bytes(namespace: str, uid: str, name: str) -> bytes:
    return str_field(1, namespace) + str_field(2, uid) + str_field(3, name)


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_claim(api: ModuleType) -> None:
    msg = api.Claim(namespace="ns", uid="0f1e-uid", name="gpu-claim")
    assert_wire(msg, claim_bytes("ns", "0f1e-uid", "gpu-claim"))
    # Field order on the wire is by number, not by the declaration order in the table.
    assert_wire(msg, b"\x0a\x02ns\x12\x080f1e-uid\x1a\x09gpu-claim")


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
@pytest.mark.parametrize("kind", ["NodePrepareResourcesRequest", "NodeUnprepareResourcesRequest"])
def test_requests_carry_repeated_claims_in_field_1(api: ModuleType, kind: str) -> None:
    cls = getattr(api, kind)
    msg = cls(
        claims=[
            api.Claim(namespace="a", uid="u1", name="c1"),
            api.Claim(namespace="b", uid="u2", name="c2"),
        ]
    )
    first = len_field(1, claim_bytes("a", "u1", "c1"))
    second = len_field(1, claim_bytes("b", "u2", "c2"))
    expected = first + second
    assert_wire(msg, expected)


def device_bytes(
    requests: list[str], pool: str, device: str, cdi: list[str], share: str | None = None
) -> bytes:
    out = b"".join(str_field(1, r) for r in requests)
    out += str_field(2, pool) + str_field(3, device)
    out += b"".join(str_field(4, c) for c in cdi)
    if share is not None:
        out += str_field(5, share)
    return out


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_device(api: ModuleType) -> None:
    msg = api.Device(
        request_names=["gpu", "nic"],
        pool_name="node-a",
        device_name="gpu-0000-1b-00-0",
        cdi_device_ids=["k8s.dra-agent.io/gpu=u1-gpu-0", "k8s.dra-agent.io/gpu=common"],
    )
    expected = device_bytes(
        ["gpu", "nic"],
        "node-a",
        "gpu-0000-1b-00-0",
        ["k8s.dra-agent.io/gpu=u1-gpu-0", "k8s.dra-agent.io/gpu=common"],
    )
    assert_wire(msg, expected)


def test_v1_device_share_id_is_optional_field_5_with_presence() -> None:
    unset = v1.Device(pool_name="p", device_name="d")
    assert not unset.HasField("share_id")
    assert_wire(unset, device_bytes([], "p", "d", []))
    # Explicit presence: an empty share ID is written (tag 0x2a, length 0), unlike a plain
    # proto3 string, and survives a round trip as "set".
    empty = v1.Device(pool_name="p", device_name="d", share_id="")
    assert empty.HasField("share_id")
    assert_wire(empty, device_bytes([], "p", "d", [], share=""))
    assert empty.SerializeToString().endswith(b"\x2a\x00")
    shared = v1.Device(pool_name="p", device_name="d", share_id="a1b2")
    assert_wire(shared, device_bytes([], "p", "d", [], share="a1b2"))
    parsed = v1.Device()
    parsed.ParseFromString(device_bytes([], "p", "d", [], share=""))
    assert parsed.HasField("share_id")


def test_v1beta1_device_has_no_field_5() -> None:
    assert "share_id" not in v1beta1.Device.DESCRIPTOR.fields_by_name
    assert 5 not in v1beta1.Device.DESCRIPTOR.fields_by_number
    # A v1 answer with a share ID parsed as v1beta1 keeps it only as an unknown field.
    parsed = v1beta1.Device()
    parsed.ParseFromString(device_bytes([], "p", "d", [], share="s"))
    assert (parsed.pool_name, parsed.device_name) == ("p", "d")


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_prepare_response_is_a_map_of_claim_uid_to_result(api: ModuleType) -> None:
    msg = api.NodePrepareResourcesResponse()
    ok = msg.claims["uid-ok"]
    ok.devices.add(request_names=["r"], pool_name="p", device_name="d", cdi_device_ids=["v/c=n"])
    msg.claims["uid-bad"].error = "device d is gone"
    ok_value = len_field(1, device_bytes(["r"], "p", "d", ["v/c=n"]))
    bad_value = str_field(2, "device d is gone")
    # deterministic=True sorts map keys: "uid-bad" < "uid-ok".
    expected = map_entry(1, "uid-bad", bad_value) + map_entry(1, "uid-ok", ok_value)
    assert_wire(msg, expected)


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_prepare_result_with_devices_and_error(api: ModuleType) -> None:
    msg = api.NodePrepareResourceResponse(
        devices=[api.Device(pool_name="p", device_name="d")],
        error="e",
    )
    assert_wire(msg, len_field(1, device_bytes([], "p", "d", [])) + str_field(2, "e"))


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_unprepare_response_writes_an_entry_even_for_success(api: ModuleType) -> None:
    msg = api.NodeUnprepareResourcesResponse()
    msg.claims["u1"]  # touching a message-valued map key creates the (empty) entry
    msg.claims["u2"].error = "busy"
    # The kubelet counts entries: an empty result is still key=1 plus an empty value=2.
    expected = map_entry(1, "u1", b"") + map_entry(1, "u2", str_field(1, "busy"))
    assert_wire(msg, expected)
    assert msg.SerializeToString(deterministic=True).startswith(b"\x0a\x06\x0a\x02u1\x12\x00")


@pytest.mark.parametrize("api", DRA, ids=["v1", "v1beta1"])
def test_unprepare_result_error_is_field_1(api: ModuleType) -> None:
    assert_wire(api.NodeUnprepareResourceResponse(error="x"), b"\x0a\x01x")


# --- device health v1alpha1 --------------------------------------------------------------


def test_health_enum_values() -> None:
    assert health.HealthStatus.Name(0) == "UNKNOWN"
    assert health.HealthStatus.Name(1) == "HEALTHY"
    assert health.HealthStatus.Name(2) == "UNHEALTHY"
    assert len(health.HealthStatus.keys()) == 3


def test_device_identifier() -> None:
    assert_wire(
        health.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
        str_field(1, "node-a") + str_field(2, "gpu-0"),
    )


def test_device_health_uses_int64_and_enum_varints() -> None:
    # A timestamp beyond 2^32 proves last_updated_time is 64-bit; a negative timeout proves the
    # field is int64 (10-byte two's complement), not sint64 (zigzag) or uint64.
    msg = health.DeviceHealth(
        device=health.DeviceIdentifier(pool_name="p", device_name="d"),
        health=health.UNHEALTHY,
        last_updated_time=(1 << 33) + 5,
        health_check_timeout_seconds=-1,
        message="Xid 79: GPU has fallen off the bus",
    )
    expected = (
        len_field(1, str_field(1, "p") + str_field(2, "d"))
        + int_field(2, 2)
        + int_field(3, (1 << 33) + 5)
        + int_field(4, -1)
        + str_field(5, "Xid 79: GPU has fallen off the bus")
    )
    assert_wire(msg, expected)
    assert int_field(4, -1) == b"\x20" + b"\xff" * 9 + b"\x01"


def test_device_health_defaults_are_not_written() -> None:
    msg = health.DeviceHealth(device=health.DeviceIdentifier(), health=health.UNKNOWN)
    # The sub-message is set (presence), the enum zero value is not written.
    assert_wire(msg, len_field(1, b""))


def test_watch_response_and_request() -> None:
    msg = health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name="p", device_name="a"),
                health=health.HEALTHY,
                last_updated_time=1_700_000_000,
            ),
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name="p", device_name="b"),
                health=health.UNHEALTHY,
                last_updated_time=1_700_000_001,
                health_check_timeout_seconds=30,
            ),
        ]
    )
    a = len_field(1, str_field(1, "p") + str_field(2, "a")) + int_field(2, 1)
    a += int_field(3, 1_700_000_000)
    b = len_field(1, str_field(1, "p") + str_field(2, "b")) + int_field(2, 2)
    b += int_field(3, 1_700_000_001) + int_field(4, 30)
    assert_wire(msg, len_field(1, a) + len_field(1, b))
    assert_wire(health.NodeWatchResourcesRequest(), b"")
