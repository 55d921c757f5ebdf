"""Decoding a request body as the real server does, driven by the 1.36 OpenAPI definitions.

The real server decodes JSON into Go structs: a wrong JSON type is a 400, an unknown field is
dropped and reported (fieldValidation=Warn, the default), a 400 with Strict, silent with Ignore;
quantities come back in canonical form. The swagger document is 4 MB, so it is read once per
process, on first use.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import APIError, bad_request
from .quantity import QuantityError, canonical_quantity
from .resources import ResourceType

SWAGGER = Path(__file__).resolve().parents[2] / "data" / "k8s-openapi" / "swagger-release-1.36.json"

_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


@functools.cache
def definitions() -> dict[str, Any]:
    """The swagger `definitions`, loaded once per process (the file is 4 MB)."""
    with SWAGGER.open(encoding="utf-8") as fh:
        defs: dict[str, Any] = json.load(fh)["definitions"]
    return defs


def definition_name(rtype: ResourceType, version: str) -> str:
    if rtype.group:
        return f"io.k8s.api.{rtype.group.split('.')[0]}.{version}.{rtype.kind}"
    return f"io.k8s.api.core.v1.{rtype.kind}"


@dataclass
class Decoded:
    obj: dict[str, Any]
    unknown: list[str] = field(default_factory=list)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Walker:
    def __init__(self, kind: str, version: str) -> None:
        self.kind = kind
        self.version = version
        self.unknown: list[str] = []

    def fail(self, value: Any, path: str, go_type: str) -> APIError:
        return bad_request(
            f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: '
            f"json: cannot unmarshal {_json_type(value)} into Go struct field "
            f"{self.kind}.{path} of type {go_type}"
        )

    def walk(self, value: Any, schema: dict[str, Any], path: str) -> Any:
        ref = schema.get("$ref")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            if name == _QUANTITY:
                try:
                    return canonical_quantity(value)
                except QuantityError as e:
                    raise bad_request(
                        f'{self.kind} in version "{self.version}" cannot be handled as a '
                        f"{self.kind}: {e}"
                    ) from None
            if name == _INT_OR_STRING:
                if isinstance(value, bool) or not isinstance(value, int | str):
                    raise self.fail(value, path, "intstr.IntOrString")
                return value
            schema = definitions()[name]
        kind = schema.get("type")
        props = schema.get("properties")
        if props is not None or kind == "object":
            if not isinstance(value, dict):
                raise self.fail(value, path, "object")
            if props is None and "additionalProperties" not in schema:
                return value  # free-form (RawExtension and friends)
            extra = schema.get("additionalProperties")
            out: dict[str, Any] = {}
            for key, item in value.items():
                sub = f"{path}.{key}" if path else key
                if item is None:
                    continue  # null decodes to the zero value and is omitted again
                if props is not None and key in props:
                    out[key] = self.walk(item, props[key], sub)
                elif isinstance(extra, dict):
                    out[key] = self.walk(item, extra, sub)
                else:
                    self.unknown.append(sub)
            return out
        if kind == "array":
            if not isinstance(value, list):
                raise self.fail(value, path, "array")
            items = schema.get("items", {})
            return [self.walk(v, items, f"{path}[{i}]") for i, v in enumerate(value)]
        if kind == "string":
            if not isinstance(value, str):
                raise self.fail(value, path, "string")
        elif kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(value, path, schema.get("format", "int"))
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.fail(value, path, "float64")
        elif kind == "boolean" and not isinstance(value, bool):
            raise self.fail(value, path, "bool")
        return value


def decode(rtype: ResourceType, version: str, body: Any) -> Decoded:
    """Check types against the served version's schema; drop and list unknown fields."""
    if not isinstance(body, dict):
        raise bad_request(
            f'{rtype.kind} in version "{version}" cannot be handled as a {rtype.kind}: '
            f"json: cannot unmarshal {_json_type(body)} into Go value of type "
            f"struct {{ APIVersion string; Kind string }}"
        )
    walker = _Walker(rtype.kind, version)
    obj = walker.walk(body, definitions()[definition_name(rtype, version)], "")
    return Decoded(obj, walker.unknown)


def apply_field_validation(mode: str, decoded: Decoded, prefix: str = "") -> list[str]:
    """Warnings to send, or a 400 in Strict mode; `mode` is the fieldValidation parameter.

    `prefix` leads the Strict message: a create or update body fails in the decoder, whose
    error says `<Kind> in version "<v>" cannot be handled as a <Kind>: `."""
    if not decoded.unknown:
        return []
    texts = [f'unknown field "{p}"' for p in decoded.unknown]
    if mode == "Strict":
        raise bad_request(prefix + "strict decoding error: " + ", ".join(texts))
    if mode == "Ignore":
        return []
    return texts


def _omit(value: Any, schema: dict[str, Any]) -> None:
    ref = schema.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        if name in (_QUANTITY, _INT_OR_STRING):
            return
        schema = definitions()[name]
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    if isinstance(value, dict) and (props is not None or isinstance(extra, dict)):
        for key in list(value):
            sub = props.get(key) if props is not None else extra
            if not isinstance(sub, dict):
                continue
            item = value[key]
            if (isinstance(item, list) and not item) or (
                isinstance(item, dict) and not item and _is_map(sub)
            ):
                del value[key]
            else:
                _omit(item, sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _omit(item, schema["items"])


def _is_map(schema: dict[str, Any]) -> bool:
    ref = schema.get("$ref")
    if ref:
        schema = definitions()[ref.rsplit("/", 1)[-1]]
    return "additionalProperties" in schema and "properties" not in schema


def omit_empty(rtype: ResourceType, obj: dict[str, Any]) -> None:
    """Drop empty lists and maps in place, as Go's `omitempty` does when the server encodes
    the stored object; a client that sends `taints: []` reads back no `taints` at all."""
    _omit(obj, definitions()[definition_name(rtype, "v1")])
