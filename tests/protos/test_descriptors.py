"""Packages, services, method paths, streaming kinds and field tables, from the descriptors.

The tables here are the kubelet's, written out independently of our .proto files. The method
path (/<package>.<Service>/<Method>) is what travels on the wire, so it is checked both from the
service descriptors and from the generated stubs.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from protos.drahealth.v1alpha1 import api_pb2 as health
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc

# (module, service) -> [(method path, request, response, server streaming)]
SERVICES: list[tuple[ModuleType, str, list[tuple[str, str, str, bool]]]] = [
    (
        reg,
        "Registration",
        [
            ("/pluginregistration.Registration/GetInfo", "InfoRequest", "PluginInfo", False),
            (
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                "RegistrationStatus",
                "RegistrationStatusResponse",
                False,
            ),
        ],
    ),
    *[
        (
            mod,
            "DRAPlugin",
            [
                (
                    f"/k8s.io.kubelet.pkg.apis.dra.{ver}.DRAPlugin/NodePrepareResources",
                    "NodePrepareResourcesRequest",
                    "NodePrepareResourcesResponse",
                    False,
                ),
                (
                    f"/k8s.io.kubelet.pkg.apis.dra.{ver}.DRAPlugin/NodeUnprepareResources",
                    "NodeUnprepareResourcesRequest",
                    "NodeUnprepareResourcesResponse",
                    False,
                ),
            ],
        )
        for mod, ver in ((v1, "v1"), (v1beta1, "v1beta1"))
    ],
    (
        health,
        "DRAResourceHealth",
        [
            (
                "/v1alpha1.DRAResourceHealth/NodeWatchResources",
                "NodeWatchResourcesRequest",
                "NodeWatchResourcesResponse",
                True,
            )
        ],
    ),
]

PACKAGES = {
    reg: "pluginregistration",
    v1: "k8s.io.kubelet.pkg.apis.dra.v1",
    v1beta1: "k8s.io.kubelet.pkg.apis.dra.v1beta1",
    health: "v1alpha1",
}

S, B, I64, E, M = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_ENUM,
    FieldDescriptor.TYPE_MESSAGE,
)
# message -> {field: (number, type, repeated, explicit presence, message/enum type or "")}
FieldTable = dict[str, dict[str, tuple[int, int, bool, bool, str]]]

REG_FIELDS: FieldTable = {
    "PluginInfo": {
        "type": (1, S, False, False, ""),
        "name": (2, S, False, False, ""),
        "endpoint": (3, S, False, False, ""),
        "supported_versions": (4, S, True, False, ""),
    },
    "RegistrationStatus": {
        "plugin_registered": (1, B, False, False, ""),
        "error": (2, S, False, False, ""),
    },
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}


def dra_fields(pkg: str, with_share_id: bool) -> FieldTable:
    device: dict[str, tuple[int, int, bool, bool, str]] = {
        "request_names": (1, S, True, False, ""),
        "pool_name": (2, S, False, False, ""),
        "device_name": (3, S, False, False, ""),
        "cdi_device_ids": (4, S, True, False, ""),
    }
    if with_share_id:
        device["share_id"] = (5, S, False, True, "")
    return {
        "NodePrepareResourcesRequest": {"claims": (1, M, True, False, f"{pkg}.Claim")},
        "NodePrepareResourcesResponse": {
            "claims": (1, M, True, False, f"{pkg}.NodePrepareResourcesResponse.ClaimsEntry")
        },
        "NodePrepareResourceResponse": {
            "devices": (1, M, True, False, f"{pkg}.Device"),
            "error": (2, S, False, False, ""),
        },
        "Device": device,
        "NodeUnprepareResourcesRequest": {"claims": (1, M, True, False, f"{pkg}.Claim")},
        "NodeUnprepareResourcesResponse": {
            "claims": (1, M, True, False, f"{pkg}.NodeUnprepareResourcesResponse.ClaimsEntry")
        },
        "NodeUnprepareResourceResponse": {"error": (1, S, False, False, "")},
        "Claim": {
            "namespace": (1, S, False, False, ""),
            "uid": (2, S, False, False, ""),
            "name": (3, S, False, False, ""),
        },
    }


HEALTH_FIELDS: FieldTable = {
    "NodeWatchResourcesRequest": {},
    "NodeWatchResourcesResponse": {"devices": (1, M, True, False, "v1alpha1.DeviceHealth")},
    "DeviceIdentifier": {
        "pool_name": (1, S, False, False, ""),
        "device_name": (2, S, False, False, ""),
    },
    "DeviceHealth": {
        "device": (1, M, False, True, "v1alpha1.DeviceIdentifier"),
        "health": (2, E, False, False, "v1alpha1.HealthStatus"),
        "last_updated_time": (3, I64, False, False, ""),
        "health_check_timeout_seconds": (4, I64, False, False, ""),
        "message": (5, S, False, False, ""),
    },
}

FIELD_TABLES = [
    (reg, REG_FIELDS),
    (v1, dra_fields("k8s.io.kubelet.pkg.apis.dra.v1", with_share_id=True)),
    (v1beta1, dra_fields("k8s.io.kubelet.pkg.apis.dra.v1beta1", with_share_id=False)),
    (health, HEALTH_FIELDS),
]
IDS = ["pluginregistration", "dra-v1", "dra-v1beta1", "health-v1alpha1"]


@pytest.mark.parametrize("mod", list(PACKAGES), ids=IDS)
def test_package_names(mod: ModuleType) -> None:
    assert mod.DESCRIPTOR.package == PACKAGES[mod]
    proto = descriptor_pb2.FileDescriptorProto()
    mod.DESCRIPTOR.CopyToProto(proto)
    assert proto.syntax == "proto3"
    assert not mod.DESCRIPTOR.dependencies, "our protos stand alone, no imports"


@pytest.mark.parametrize(("mod", "service", "methods"), SERVICES, ids=IDS)
def test_service_method_paths(
    mod: ModuleType, service: str, methods: list[tuple[str, str, str, bool]]
) -> None:
    assert list(mod.DESCRIPTOR.services_by_name) == [service]
    svc = mod.DESCRIPTOR.services_by_name[service]
    seen = [
        (
            f"/{svc.full_name}/{m.name}",
            m.input_type.name,
            m.output_type.name,
            m.server_streaming,
        )
        for m in svc.methods
    ]
    assert seen == methods
    assert not any(m.client_streaming for m in svc.methods)
    for m in svc.methods:
        assert m.input_type.file is mod.DESCRIPTOR
        assert m.output_type.file is mod.DESCRIPTOR


class RecordingChannel:
    """Stands in for grpc.Channel: records the path and kind of every callable a stub builds."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def make(path: str, *args: Any, **kwargs: Any) -> object:
            self.paths[path] = kind
            return object()

        return make

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


@pytest.mark.parametrize(
    ("stub", "expected"),
    [
        (
            reg_grpc.RegistrationStub,
            {
                "/pluginregistration.Registration/GetInfo": "unary_unary",
                "/pluginregistration.Registration/NotifyRegistrationStatus": "unary_unary",
            },
        ),
        (
            v1_grpc.DRAPluginStub,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources": "unary_unary",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources": "unary_unary",
            },
        ),
        (
            v1beta1_grpc.DRAPluginStub,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources": (
                    "unary_unary"
                ),
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources": (
                    "unary_unary"
                ),
            },
        ),
        (
            health_grpc.DRAResourceHealthStub,
            {"/v1alpha1.DRAResourceHealth/NodeWatchResources": "unary_stream"},
        ),
    ],
    ids=IDS,
)
def test_generated_stubs_call_the_exact_paths(stub: Any, expected: dict[str, str]) -> None:
    channel = RecordingChannel()
    stub(channel)
    assert channel.paths == expected


@pytest.mark.parametrize(("mod", "table"), FIELD_TABLES, ids=IDS)
def test_field_tables(mod: ModuleType, table: FieldTable) -> None:
    assert sorted(mod.DESCRIPTOR.message_types_by_name) == sorted(table)
    for msg_name, fields in table.items():
        desc = mod.DESCRIPTOR.message_types_by_name[msg_name]
        seen = {
            f.name: (
                f.number,
                f.type,
                f.is_repeated,
                f.has_presence,
                (f.message_type or f.enum_type).full_name
                if (f.message_type or f.enum_type)
                else "",
            )
            for f in desc.fields
        }
        assert seen == fields, msg_name


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_claim_maps_are_string_keyed_maps(mod: ModuleType) -> None:
    for name in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        entry = mod.DESCRIPTOR.message_types_by_name[name].nested_types_by_name["ClaimsEntry"]
        assert entry.GetOptions().map_entry
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        assert (key.number, key.type) == (1, FieldDescriptor.TYPE_STRING)
        assert (value.number, value.type) == (2, FieldDescriptor.TYPE_MESSAGE)


def test_share_id_is_a_proto3_optional_not_a_user_oneof() -> None:
    field = v1.Device.DESCRIPTOR.fields_by_name["share_id"]
    # proto3 `optional` is a synthetic oneof named _<field>; a real oneof would differ on the
    # wire only in grouping but would change the generated Python API.
    assert field.containing_oneof is not None
    assert field.containing_oneof.name == "_share_id"
    assert [o.name for o in v1.Device.DESCRIPTOR.oneofs] == ["_share_id"]


def test_health_enum_numbers() -> None:
    enum = health.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
