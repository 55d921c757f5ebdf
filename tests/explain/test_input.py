"""Bad input is reported with the file and line, as the API server would refuse it."""

import json
from pathlib import Path

import pytest

from agent.explain.devices import parse_slice
from agent.explain.docs import InputError, load_text
from agent.explain.model import parse_claim, parse_class
from agent.explain.schema import SCHEMA

OPENAPI = Path(__file__).resolve().parents[1] / "data" / "k8s-openapi"
SWAGGER = OPENAPI / "swagger-release-1.36.json"
SWAGGER_137 = OPENAPI / "swagger-release-1.37.json"
#: Fields 1.37 renamed: the table knows both names (new: old).
RENAMED_IN_137 = {("Device", "nodeAllocatableResources"): "nodeAllocatableResourceMappings"}

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: c
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.dra-agent.io
        cuont: 2
"""


def test_schema_table_matches_the_kubernetes_136_openapi():
    definitions = json.loads(SWAGGER.read_text())["definitions"]
    renamed = {(t, new) for t, new in RENAMED_IN_137}
    for type_name, fields in SCHEMA.items():
        props = definitions[f"io.k8s.api.resource.v1.{type_name}"]["properties"]
        assert set(fields) - {n for t, n in renamed if t == type_name} == set(props), type_name
        for name, spec in fields.items():
            if name not in props:
                continue  # a 1.37 name: test_renamed_fields_... checks it
            kind = props[name].get("type")
            if spec.startswith("L:"):
                assert kind == "array", (type_name, name)
            elif spec.startswith("M:"):
                assert kind == "object" and "additionalProperties" in props[name]
            elif spec.startswith("T:"):
                assert props[name]["$ref"].endswith("." + spec[2:]), (type_name, name)
            elif spec in ("str", "int", "bool"):
                ref = props[name].get("$ref", "")
                assert kind == {"str": "string", "int": "integer", "bool": "boolean"}[spec] or (
                    spec == "str" and ref.endswith(".Time")), (type_name, name)
            elif spec == "qty":
                assert props[name]["$ref"].endswith(".Quantity"), (type_name, name)


def test_renamed_fields_are_known_by_both_names_and_typed_as_137_says():
    definitions = json.loads(SWAGGER_137.read_text())["definitions"]
    for (type_name, new), old in RENAMED_IN_137.items():
        props = definitions[f"io.k8s.api.resource.v1.{type_name}"]["properties"]
        assert new in props and old not in props
        assert SCHEMA[type_name][new] == SCHEMA[type_name][old]


SLICE_WITH = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: s}}
spec:
  driver: dra-agent.io
  nodeName: node1
  pool: {{name: node1, generation: 1, resourceSliceCount: 1}}
  devices:
  - name: cpu-0
    attributes:
      resource.kubernetes.io/numaNode: {{ints: [0, 2]}}
    capacity: {{cpus: {{value: "8"}}}}
    {field}:
      cpu: {{mapping: {{capacityKey: cpus}}}}
"""


@pytest.mark.parametrize("field", ["nodeAllocatableResources",  # 1.37
                                   "nodeAllocatableResourceMappings"])  # 1.36
def test_slices_with_either_name_of_node_allocatable_resources_are_read(field):
    (device,) = parse_slice(load_text(SLICE_WITH.format(field=field), "s.yaml")[0]).devices
    assert device.name == "cpu-0"


def test_unknown_field_names_the_line_and_the_known_fields():
    doc = load_text(CLAIM, "claim.yaml")[0]
    with pytest.raises(InputError) as err:
        parse_claim(doc)
    assert err.value.where == "claim.yaml:11"
    assert "cuont" in str(err.value) and "count" in str(err.value)


def test_bad_yaml_points_at_the_line():
    text = "apiVersion: v1\nkind: ResourceClaim\nspec:\n  devices: [\n    oops: : x\n"
    with pytest.raises(InputError) as err:
        load_text(text, "bad.yaml")
    assert err.value.where.startswith("bad.yaml:")
    assert int(err.value.where.split(":")[1]) >= 4


def test_wrong_type_is_reported_with_the_path():
    text = CLAIM.replace("cuont: 2", "count: two")
    with pytest.raises(InputError) as err:
        parse_claim(load_text(text, "c.yaml")[0])
    assert err.value.where == "c.yaml:11"
    assert "spec.devices.requests[0].exactly.count" in str(err.value)


def test_list_documents_yield_their_items_with_lines():
    text = ("apiVersion: v1\nkind: List\nitems:\n- kind: DeviceClass\n  metadata: {name: a}\n"
            "- kind: DeviceClass\n  metadata: {name: b}\n  spec:\n    selectors:\n"
            "    - cel: {expression: 'true'}\n    - cel: {}\n")
    docs = load_text(text, "list.yaml")
    assert parse_class(docs[0]).name == "a"
    with pytest.raises(InputError) as err:
        parse_class(docs[1])
    assert err.value.where == "list.yaml:11"


def test_request_needs_exactly_one_form_and_known_constraint_requests():
    base = load_text(CLAIM.replace("        cuont: 2\n", ""), "c.yaml")[0].obj
    base["spec"]["devices"]["constraints"] = [{"matchAttribute": "x.io/a", "requests": ["nic"]}]
    with pytest.raises(InputError, match="no request named nic"):
        parse_claim(load_text(json.dumps(base), "c.json")[0])
    base["spec"]["devices"]["constraints"] = [{"matchAttribute": "unqualified"}]
    with pytest.raises(InputError, match="fully qualified"):
        parse_claim(load_text(json.dumps(base), "c.json")[0])


def test_slices_reject_bad_quantities_and_versions():
    obj = {"kind": "ResourceSlice", "spec": {
        "driver": "d.io", "nodeName": "n", "pool": {"name": "p", "generation": 0,
                                                    "resourceSliceCount": 1},
        "devices": [{"name": "x", "capacity": {"memory": {"value": "80 Gi"}}}]}}
    with pytest.raises(InputError, match="not a quantity"):
        parse_slice(load_text(json.dumps(obj), "s.json")[0])
    obj["spec"]["devices"] = [{"name": "x", "attributes": {"v": {"version": "1.2"}}}]
    with pytest.raises(InputError, match="semantic version"):
        parse_slice(load_text(json.dumps(obj), "s.json")[0])


def test_v1beta1_slices_are_flattened():
    obj = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "spec": {
        "driver": "d.io", "nodeName": "n", "pool": {"name": "p", "generation": 0,
                                                    "resourceSliceCount": 1},
        "devices": [{"name": "x", "basic": {"attributes": {"type": {"string": "gpu"}}}}]}}
    s = parse_slice(load_text(json.dumps(obj), "s.json")[0])
    assert s.devices[0].attribute("d.io/type") == ("string", "gpu")
