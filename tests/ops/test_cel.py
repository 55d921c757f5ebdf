"""The CEL in deploy/ compiles and decides as the API server and scheduler would.

The ``cel`` package has no Kubernetes type checker, so the environments are rebuilt here the way
the scheduler (DeviceClass selectors: one ``device`` variable whose attributes are grouped by
domain, unqualified names in the driver's domain) and the admission plugin (``request``,
``object``, ``oldObject``, ``variables``...) present them, and the expressions are run on
real-shaped inputs: devices built by discovery's own model, admission requests with and
without the node-bound token's extra info.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cel
import pytest

from agent.common.config import ALL_DEVICE_TYPES, DEFAULT_DRIVER
from discovery.model import PCIE_ROOT, Device, DeviceType, Version
from discovery.sharing import parse_sharing, shareable
from tests.conftest import REPO
from tests.ops.openapi import load_documents

BASE = REPO / "deploy" / "base"
SA_USER = "system:serviceaccount:dra-agent:dra-agent"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
#: Variables the ValidatingAdmissionPolicy CEL environment declares.
VAP_VARIABLES = {
    "request", "object", "oldObject", "params", "namespaceObject", "authorizer", "variables",
}


def _docs(path: Path, kind: str) -> list[dict[str, Any]]:
    return [d for d in load_documents(path) if d.get("kind") == kind]


def _cel_device(api_device: dict[str, Any], driver: str) -> dict[str, Any]:
    """A v1 Device dict as DRA's CEL sees it: ``device.attributes[domain][name]``."""
    attributes: dict[str, dict[str, Any]] = {}
    for key, value in api_device.get("attributes", {}).items():
        domain, _, name = key.rpartition("/")
        ((_, plain),) = value.items()  # one-of: string, int, bool or version
        attributes.setdefault(domain or driver, {})[name] = plain
    capacity: dict[str, dict[str, Any]] = {}
    for key, value in api_device.get("capacity", {}).items():
        domain, _, name = key.rpartition("/")
        capacity.setdefault(domain or driver, {})[name] = value["value"]
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(api_device.get("allowMultipleAllocations")),
    }


def _device(kind: DeviceType, name: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {PCIE_ROOT: "pci0000:1a", "productName": "example"}
    if kind in (DeviceType.GPU, DeviceType.MIG):
        attrs["driverVersion"] = Version("570.86.15")
    return Device(name=name, type=kind, attributes=attrs, capacity={"memory": "80Gi"}).to_api()


@pytest.fixture(scope="module")
def classes() -> dict[str, str]:
    """DeviceClass name -> its one CEL selector."""
    out = {}
    for dc in _docs(BASE / "deviceclasses.yaml", "DeviceClass"):
        (selector,) = dc["spec"]["selectors"]
        out[dc["metadata"]["name"]] = selector["cel"]["expression"]
    return out


def _shared(kind: DeviceType, name: str, mode: str) -> dict[str, Any]:
    device = Device(name=name, type=kind, attributes={PCIE_ROOT: "pci0000:1a"},
                    capacity={"memory": "80Gi"})
    shared, why = shareable(device, parse_sharing(mode))
    assert shared is not None, why
    return shared.to_api()


def test_one_class_per_device_type_named_after_the_driver(classes: dict[str, str]) -> None:
    assert set(classes) == {f"{t}.{DEFAULT_DRIVER}" for t in (*ALL_DEVICE_TYPES, "vfio")} | {
        f"{t}-shared.{DEFAULT_DRIVER}" for t in ("gpu", "nic")}


@pytest.mark.parametrize(("kind", "mode"), [(DeviceType.GPU, "gpu=shares:4"),
                                            (DeviceType.GPU, "gpu=memory:10Gi"),
                                            (DeviceType.NIC, "nic=shares:2")])
def test_a_shareable_device_is_selected_by_its_shared_class_only(
    classes: dict[str, str], kind: DeviceType, mode: str
) -> None:
    device = _cel_device(_shared(kind, f"{kind}-0", mode), DEFAULT_DRIVER)
    chosen = [name for name, expression in classes.items()
              if cel.evaluate(expression, {"device": device})]
    assert chosen == [f"{kind}-shared.{DEFAULT_DRIVER}"]


def test_shared_classes_leave_exclusive_devices_alone(classes: dict[str, str]) -> None:
    for kind in ("gpu", "nic"):
        device = _cel_device(_device(DeviceType(kind), f"{kind}-0"), DEFAULT_DRIVER)
        assert cel.evaluate(classes[f"{kind}-shared.{DEFAULT_DRIVER}"],
                            {"device": device}) is False


def test_selectors_compile_and_use_only_the_device_variable(classes: dict[str, str]) -> None:
    for name, expression in classes.items():
        program = cel.compile(expression)
        assert program.references()["variables"] == ["device"], name


@pytest.mark.parametrize("kind", list(DeviceType))
def test_each_class_selects_exactly_its_own_type(classes: dict[str, str], kind: DeviceType) -> None:
    for other in DeviceType:
        device = _cel_device(_device(other, f"{other}-0"), DEFAULT_DRIVER)
        selected = cel.evaluate(classes[f"{kind}.{DEFAULT_DRIVER}"], {"device": device})
        assert selected is (other == kind), f"{kind} class on a {other} device"


def test_classes_ignore_other_drivers_devices(classes: dict[str, str]) -> None:
    # Another driver's device with the same attribute name in its own domain.
    foreign = _cel_device(_device(DeviceType.GPU, "gpu-0"), "gpu.example.com")
    for expression in classes.values():
        assert cel.evaluate(expression, {"device": foreign}) is False


def test_a_broken_selector_would_fail_to_compile() -> None:
    # Guards the compile test: the package does reject bad syntax.
    with pytest.raises(ValueError):
        cel.compile("device.driver == 'dra-agent.io' &&")


# --- ValidatingAdmissionPolicy -------------------------------------------------------------


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    (vap,) = _docs(BASE / "admission-policy.yaml", "ValidatingAdmissionPolicy")
    return vap


def _expressions(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    out = [c["expression"] for c in spec.get("matchConditions", [])]
    out += [v["expression"] for v in spec.get("variables", [])]
    for v in spec["validations"]:
        out.append(v["expression"])
        if "messageExpression" in v:
            out.append(v["messageExpression"])
    return out


def test_policy_expressions_compile_in_the_admission_environment(policy: dict[str, Any]) -> None:
    for expression in _expressions(policy):
        refs = cel.compile(expression).references()
        assert set(refs["variables"]) <= VAP_VARIABLES, expression


def _admit(
    policy: dict[str, Any],
    operation: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
    username: str = SA_USER,
    node: str | None = "node-a",
) -> tuple[bool, str]:
    """The admission plugin's evaluation order: match conditions, variables, validations."""
    user: dict[str, Any] = {"username": username}
    if node is not None:
        user["extra"] = {NODE_NAME_KEY: [node]}
    env: dict[str, Any] = {
        "request": {"operation": operation, "userInfo": user},
        "object": obj,
        "oldObject": old,
    }
    spec = policy["spec"]
    if not all(cel.evaluate(c["expression"], env) for c in spec["matchConditions"]):
        return True, "not matched"
    env["variables"] = {}
    for var in spec["variables"]:
        env["variables"] = {**env["variables"], var["name"]: cel.evaluate(var["expression"], env)}
    for rule in spec["validations"]:
        if not cel.evaluate(rule["expression"], env):
            if "messageExpression" in rule:
                return False, str(cel.evaluate(rule["messageExpression"], env))
            return False, rule["message"]
    return True, ""


def _slice(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DEFAULT_DRIVER, "pool": {"name": node or "shared"}}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


def test_agent_writes_its_own_nodes_slices(policy: dict[str, Any]) -> None:
    assert _admit(policy, "CREATE", _slice("node-a"), None)[0]
    assert _admit(policy, "UPDATE", _slice("node-a"), _slice("node-a"))[0]
    assert _admit(policy, "DELETE", None, _slice("node-a"))[0]


def test_agent_cannot_create_or_delete_another_nodes_slices(policy: dict[str, Any]) -> None:
    ok, message = _admit(policy, "CREATE", _slice("node-b"), None)
    assert not ok
    assert "node-a" in message and "node-b" in message
    assert not _admit(policy, "DELETE", None, _slice("node-b"))[0]


def test_agent_cannot_move_slices_between_nodes(policy: dict[str, Any]) -> None:
    ok, message = _admit(policy, "UPDATE", _slice("node-a"), _slice("node-b"))
    assert not ok and "another node" in message
    assert not _admit(policy, "UPDATE", _slice("node-b"), _slice("node-a"))[0]


def test_agent_cannot_publish_slices_without_a_node(policy: dict[str, Any]) -> None:
    ok, message = _admit(policy, "CREATE", _slice(None), None)
    assert not ok and "without spec.nodeName" in message


def test_token_without_node_binding_is_refused(policy: dict[str, Any]) -> None:
    ok, message = _admit(policy, "CREATE", _slice("node-a"), None, node=None)
    assert not ok and "node-bound token" in message


def test_other_users_are_not_this_policys_business(policy: dict[str, Any]) -> None:
    # The kubelet wipes slices of its node; the scheduler and others are governed elsewhere.
    assert _admit(policy, "DELETE", None, _slice("node-b"), username="system:node:node-a") == (
        True, "not matched",
    )
