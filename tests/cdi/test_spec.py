"""Spec model: exact field names, minimal version, validation, parse-back, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi.errors import CDIError, CDINameError, CDISpecError
from cdi.names import (
    parse_qualified_name,
    qualified_name,
    validate_class,
    validate_device_name,
    validate_vendor,
)
from cdi.parse import spec_from_dict
from cdi.spec import (
    CDIDevice,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    NetDevice,
    Spec,
    minimal_version,
)
from tests.cdi.conftest import Checker

ENV = ContainerEdits(env=("A=1",))


def full_spec() -> Spec:
    return Spec(
        kind="k8s.dra-agent.io/claim",
        devices=(
            CDIDevice(
                "c1-gpu-0",
                ContainerEdits(
                    env=("GPU=0",),
                    device_nodes=(
                        DeviceNode("/dev/nvidia0", type="c", major=195, minor=0, file_mode=438),
                    ),
                ),
            ),
        ),
        container_edits=ContainerEdits(
            env=("NVIDIA_VISIBLE_DEVICES=void",),
            device_nodes=(DeviceNode("/dev/nvidiactl", permissions="rw", uid=0, gid=0),),
            mounts=(Mount("/h/libcuda.so.1", "/usr/lib/libcuda.so.1", ("ro", "rbind")),),
            hooks=(Hook("createContainer", "/usr/bin/hook", ("hook", "x"), ("D=1",), 5),),
        ),
    )


def test_to_dict_uses_exact_camel_case_keys_in_a_fixed_order() -> None:
    d = full_spec().to_dict()
    assert list(d) == ["cdiVersion", "kind", "devices", "containerEdits"]
    assert d["cdiVersion"] == "0.3.0"
    assert d["devices"][0]["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438,
    }  # fmt: skip
    edits = d["containerEdits"]
    assert list(edits) == ["env", "deviceNodes", "mounts", "hooks"]
    assert edits["mounts"][0] == {
        "hostPath": "/h/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1",
        "options": ["ro", "rbind"],
    }  # fmt: skip
    assert edits["hooks"][0] == {
        "hookName": "createContainer", "path": "/usr/bin/hook", "args": ["hook", "x"],
        "env": ["D=1"], "timeout": 5,
    }  # fmt: skip


def test_round_trip_through_dict_and_json_is_lossless() -> None:
    spec = full_spec()
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_output_is_deterministic() -> None:
    assert json.dumps(full_spec().to_dict()) == json.dumps(full_spec().to_dict())


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (Spec("vendor.io/gpu", (CDIDevice("gpu0", ENV),)), "0.3.0"),
        (Spec("vendor.io/gpu", (CDIDevice("0gpu", ENV),)), "0.5.0"),
        (
            Spec("vendor.io/gpu", (CDIDevice("gpu0", ENV),),
                 ContainerEdits(device_nodes=(DeviceNode("/dev/x", host_path="/h/x"),))),
            "0.5.0",
        ),
        (
            Spec("vendor.io/gpu", (CDIDevice("a", ContainerEdits(mounts=(
                Mount("/a", "/b", type="none"),))),)),
            "0.4.0",
        ),
        (Spec("vendor.io/gpu.x", (CDIDevice("gpu0", ENV),)), "0.6.0"),
        (
            Spec("vendor.io/nic", (CDIDevice("0nic", ContainerEdits(
                net_devices=(NetDevice("eth1", "net1"),))),)),
            "1.1.0",
        ),
    ],
)  # fmt: skip
def test_minimal_version_is_the_lowest_that_covers_the_features(spec: Spec, version: str) -> None:
    assert minimal_version(spec) == version
    assert spec.to_dict()["cdiVersion"] == version


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (ContainerEdits(env=("NOEQUALS",)), "not NAME=value"),
        (ContainerEdits(env=("=x",)), "not NAME=value"),
        (ContainerEdits(device_nodes=(DeviceNode("/dev/x", type="x"),)), "bad type"),
        (ContainerEdits(device_nodes=(DeviceNode("/dev/x", permissions="rwx"),)), "r, w, m"),
        (ContainerEdits(mounts=(Mount("", "/b"),)), "hostPath and containerPath"),
        (ContainerEdits(hooks=(Hook("preStart", "/bin/x"),)), "unknown hookName"),
        (ContainerEdits(hooks=(Hook("poststop", "bin/x"),)), "not absolute"),
        (ContainerEdits(hooks=(Hook("poststop", "/bin/x", timeout=0),)), "timeout"),
        (
            ContainerEdits(net_devices=(NetDevice("eth1", "a"), NetDevice("eth2", "a"))),
            "appears twice",
        ),
        (ContainerEdits(), "no container edits"),
    ],
)
def test_validate_refuses_what_runtimes_refuse(edits: ContainerEdits, message: str) -> None:
    with pytest.raises(CDISpecError, match=message):
        Spec("vendor.io/gpu", (CDIDevice("gpu0", edits),)).validate()


def test_validate_refuses_duplicate_and_missing_devices() -> None:
    with pytest.raises(CDISpecError, match="defined twice"):
        Spec("vendor.io/gpu", (CDIDevice("a", ENV), CDIDevice("a", ENV))).validate()
    with pytest.raises(CDISpecError, match="at least one device"):
        Spec("vendor.io/gpu", ()).validate()
    with pytest.raises(CDIError, match="vendor/class"):
        Spec("nokind", (CDIDevice("a", ENV),)).validate()


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.io/gpu",
        "devices": [{"name": "gpu0", "containerEdits": {"env": ["A=1"]}}],
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be an object"),
        (_doc(cdiVersion=None), "cdiVersion"),
        (_doc(cdiVersion="9.9.9"), "unknown cdiVersion"),
        (_doc(cdiVersion="banana"), "unknown cdiVersion"),
        (_doc(annotations={"a": "b"}), "unknown or unsupported field"),
        (_doc(devices=[{"name": "gpu0", "containerEdits": {"devicenodes": []}}]), "devicenodes"),
        (_doc(devices=[{"name": 3, "containerEdits": {"env": ["A=1"]}}]), "name"),
        (_doc(devices=[{"name": "a", "containerEdits": {"env": [1]}}]), "list of strings"),
        (_doc(devices=[{"name": "a", "containerEdits": {"deviceNodes": [
            {"path": "/dev/x", "major": True}]}}]), "integer"),
        (_doc(devices=[{"name": "a", "containerEdits": {"deviceNodes": [
            {"path": "/dev/x", "fileMode": -1}]}}]), "non-negative"),
        (_doc(devices=[{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/a"}]}}]),
         "containerPath is required"),
        (_doc(devices=[{"name": "0a", "containerEdits": {"env": ["A=1"]}}]), "too low"),
        (_doc(devices="x"), "must be a list"),
    ],
)  # fmt: skip
def test_from_dict_rejects_bad_input_with_the_field_named(doc: Any, message: str) -> None:
    with pytest.raises(CDIError, match=message):
        spec_from_dict(doc)


def test_merge_later_entries_replace_earlier_ones_like_a_runtime() -> None:
    a = ContainerEdits(
        env=("A=1", "B=1"),
        device_nodes=(DeviceNode("/dev/x", major=1),),
        mounts=(Mount("/h1", "/c"),),
        hooks=(Hook("poststop", "/bin/h"),),
    )
    b = ContainerEdits(
        env=("A=2",),
        device_nodes=(DeviceNode("/dev/x", major=2), DeviceNode("/dev/y")),
        mounts=(Mount("/h2", "/c"),),
        hooks=(Hook("poststop", "/bin/h"),),
        net_devices=(NetDevice("eth1", "eth1"),),
    )
    m = a.merge(b)
    assert m.env == ("A=2", "B=1")
    assert m.device_nodes == (DeviceNode("/dev/x", major=2), DeviceNode("/dev/y"))
    assert m.mounts == (Mount("/h2", "/c"),)
    assert m.hooks == (Hook("poststop", "/bin/h"),)
    assert m.net_devices == (NetDevice("eth1", "eth1"),)
    assert m.without(a) == ContainerEdits(
        env=("A=2",), device_nodes=m.device_nodes, mounts=m.mounts,
        net_devices=m.net_devices,
    )  # fmt: skip


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", ["k8s.dra-agent.io", "vendor.com", "Ab", "a_b-c.d9"])
def test_good_vendors(vendor: str) -> None:
    validate_vendor(vendor)


@pytest.mark.parametrize(
    "vendor", ["", "a", "9vendor", "vendor.", "ven/dor", "vendör.io", "-x", "a" * 254, "a b"]
)
def test_bad_vendors(vendor: str) -> None:
    with pytest.raises(CDINameError):
        validate_vendor(vendor)


@pytest.mark.parametrize("klass", ["", "g", "gpu-", "1gpu", "g/pu", "x" * 64])
def test_bad_classes(klass: str) -> None:
    with pytest.raises(CDINameError):
        validate_class(klass)


@pytest.mark.parametrize("name", ["gpu0", "0", "0a", "a:b", "a.b_c-d", "A"])
def test_good_device_names(name: str) -> None:
    validate_device_name(name)


@pytest.mark.parametrize("name", ["", "-a", "a-", "a b", "a/b", "a=b", "ä"])
def test_bad_device_names(name: str) -> None:
    with pytest.raises(CDINameError):
        validate_device_name(name)


def test_qualified_names_split_on_first_slash_and_equals() -> None:
    assert qualified_name("vendor.io", "gpu", "a:b") == "vendor.io/gpu=a:b"
    assert parse_qualified_name("vendor.io/gpu=a") == ("vendor.io", "gpu", "a")
    with pytest.raises(CDINameError, match="path"):
        parse_qualified_name("/dev/nvidia0")
    for bad in ("vendor.io/gpu", "vendor.io=gpu", "vendor.io/gpu=a=b", "vendor.io/g/pu=a"):
        with pytest.raises(CDINameError):
            parse_qualified_name(bad)


_name = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)


@given(
    vendor=_name,
    klass=_name,
    device=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,30}", fullmatch=True),
)
def test_qualified_name_round_trips(vendor: str, klass: str, device: str) -> None:
    if not device[-1].isalnum():
        device += "0"
    assert parse_qualified_name(qualified_name(vendor + ".io", klass, device)) == (
        vendor + ".io", klass, device,
    )  # fmt: skip


def test_names_we_accept_the_reference_library_accepts(checker: Checker, tmp_path: Path) -> None:
    names = ["gpu0", "0gpu", "a:b", "a.b_c-d", "Z"]
    spec = Spec("Vendor_x-y.io/class_x-y", tuple(CDIDevice(n, ENV) for n in names))
    path = tmp_path / "names.json"
    path.write_text(json.dumps(spec.to_dict()))
    out = checker.validate(path)
    for n in names:
        assert f"Vendor_x-y.io/class_x-y={n}" in out


_path = st.from_regex(r"/[a-z0-9_.-]{1,12}(/[a-z0-9_.-]{1,12}){0,3}", fullmatch=True)
_env = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}=[ -~]{0,20}", fullmatch=True)
_edits = st.builds(
    ContainerEdits,
    env=st.lists(_env, max_size=3).map(tuple),
    device_nodes=st.lists(
        st.builds(DeviceNode, path=_path, host_path=st.none() | _path,
                  type=st.none() | st.sampled_from(["c", "b", "u", "p"]),
                  major=st.none() | st.integers(0, 4095), minor=st.none() | st.integers(0, 2**20),
                  file_mode=st.none() | st.integers(0, 0o777),
                  permissions=st.none() | st.sampled_from(["r", "rw", "rwm", "m"])),
        max_size=3, unique_by=lambda n: n.path,
    ).map(tuple),
    mounts=st.lists(st.builds(Mount, host_path=_path, container_path=_path,
                              options=st.lists(st.sampled_from(["ro", "rbind", "nosuid"]),
                                               max_size=3).map(tuple)),
                    max_size=3).map(tuple),
    hooks=st.lists(st.builds(Hook, hook_name=st.sampled_from(sorted(["createContainer",
                                                                     "poststop"])),
                             path=_path, args=st.lists(st.text(max_size=5), max_size=3).map(tuple)),
                   max_size=2).map(tuple),
)  # fmt: skip


@given(device_edits=_edits, common=_edits, name=st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True))
def test_any_valid_spec_round_trips_through_json(
    device_edits: ContainerEdits, common: ContainerEdits, name: str
) -> None:
    if device_edits.is_empty():
        device_edits = ENV
    spec = Spec("vendor.io/gpu", (CDIDevice(name, device_edits),), common)
    text = json.dumps(spec.to_dict())
    assert spec_from_dict(json.loads(text)) == spec
    assert json.dumps(spec_from_dict(json.loads(text)).to_dict()) == text
