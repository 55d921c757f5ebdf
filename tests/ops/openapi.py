"""Strict validation of Kubernetes objects against the official OpenAPI v2 document.

What ``kubectl apply --validate=strict`` checks, offline: the schema of the object's kind
(found through ``x-kubernetes-group-version-kind``), required fields, types, and unknown fields.
OpenAPI v2 never says ``additionalProperties: false``, so every object schema that lists its
properties is closed here, except those marked ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft4Validator

OPENAPI_DIR = Path(__file__).resolve().parents[1] / "data" / "k8s-openapi"
#: The Kubernetes minors whose official OpenAPI documents tests/data holds (README there):
#: the oldest supported, the one the fake API server copies, and the current one.
KUBE_VERSIONS = ("1.35", "1.36", "1.37")
SWAGGER = OPENAPI_DIR / "swagger-release-1.36.json"


def swagger(version: str) -> Path:
    return OPENAPI_DIR / f"swagger-release-{version}.json"


class _StrictLoader(yaml.SafeLoader):
    """YAML loader that refuses duplicate keys (the API server's strict decoding does too)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_documents(path: Path) -> list[Any]:
    """Every YAML document in a file, empty documents dropped, duplicate keys refused."""
    return [d for d in yaml.load_all(path.read_text(), Loader=_StrictLoader) if d is not None]


QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
#: The grammar in the Quantity type's own description; JSON numbers are accepted too.
QUANTITY_PATTERN = (
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)


def _strict(node: Any, partial: bool) -> Any:
    if isinstance(node, list):
        return [_strict(n, partial) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v, partial) for k, v in node.items()}
    if out.get("format") == "int-or-string":
        out["type"] = ["integer", "string"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if partial:
        out.pop("required", None)
    return out


@dataclass(frozen=True)
class Gvk:
    group: str
    version: str
    kind: str

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Gvk:
        api_version = str(obj.get("apiVersion", ""))
        group, _, version = api_version.rpartition("/")
        return cls(group, version, str(obj.get("kind", "")))


class OpenAPI:
    def __init__(self, path: Path = SWAGGER) -> None:
        self.doc: dict[str, Any] = json.loads(path.read_text())

    @cached_property
    def definitions_by_gvk(self) -> dict[Gvk, str]:
        out: dict[Gvk, str] = {}
        for name, schema in self.doc["definitions"].items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                key = Gvk(gvk["group"], gvk["version"], gvk["kind"])
                # Shared types (DeleteOptions, WatchEvent) claim many kinds; keep the first.
                out.setdefault(key, name)
        return out

    @cached_property
    def namespaced_kinds(self) -> frozenset[Gvk]:
        """Kinds served under ``/namespaces/{namespace}/``, read from the document's paths."""
        out: set[Gvk] = set()
        for path, item in self.doc["paths"].items():
            if "/namespaces/{namespace}/" not in path:
                continue
            for op in item.values():
                if isinstance(op, dict) and "x-kubernetes-group-version-kind" in op:
                    g = op["x-kubernetes-group-version-kind"]
                    out.add(Gvk(g["group"], g["version"], g["kind"]))
        return frozenset(out)

    def _validator(self, partial: bool) -> Draft4Validator:
        cache = self.__dict__.setdefault("_validators", {})
        if partial not in cache:
            defs = _strict(copy.deepcopy(self.doc["definitions"]), partial)
            defs[QUANTITY] = {"type": ["string", "number"], "pattern": QUANTITY_PATTERN}
            cache[partial] = defs
        return Draft4Validator({"definitions": cache[partial]})

    def is_namespaced(self, obj: dict[str, Any]) -> bool:
        return Gvk.of(obj) in self.namespaced_kinds

    def errors(self, obj: Any, partial: bool = False) -> list[str]:
        """Every schema violation of one object; ``partial`` (patches) skips required fields."""
        if not isinstance(obj, dict):
            return [f"not a mapping: {obj!r:.60}"]
        gvk = Gvk.of(obj)
        name = self.definitions_by_gvk.get(gvk)
        if name is None:
            return [f"unknown kind {obj.get('apiVersion')}/{obj.get('kind')}"]
        defs = self._validator(partial).schema["definitions"]
        validator = Draft4Validator({"$ref": f"#/definitions/{name}", "definitions": defs})
        label = f"{gvk.kind}/{obj.get('metadata', {}).get('name', '?')}"
        return sorted(
            f"{label}: .{'.'.join(str(p) for p in err.absolute_path)}: {err.message}"
            for err in validator.iter_errors(obj)
        )
