"""Our opaque device configuration, carried in claims and DeviceClasses.

A claim (or class) passes it as ``opaque: {driver: <our driver>, parameters: {...}}``::

    apiVersion: dra-agent.io/v1alpha1
    kind: DeviceConfig
    env:                      # extra environment for the containers using these devices
      NCCL_DEBUG: INFO

Decoding is strict, as Kubernetes is for its own types: an unknown field or a wrong
``kind``/``apiVersion`` is an error naming the field, instead of being silently ignored and
leaving the user wondering why the setting had no effect.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "dra-agent.io"
KIND = "DeviceConfig"
#: Versions this agent decodes; a newer one is refused with a message naming what we know.
VERSIONS = ("v1alpha1",)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_ENV = 64


class ConfigDecodeError(ValueError):
    """The opaque parameters are not a DeviceConfig we can use."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"opaque config field {field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    env: Mapping[str, str] = field(default_factory=dict)

    def merged(self, later: DeviceConfig) -> DeviceConfig:
        """``later`` wins key by key (class config first, then claim config)."""
        return DeviceConfig(env={**self.env, **later.env})


def decode_config(params: Any) -> DeviceConfig:
    if not isinstance(params, Mapping):
        raise ConfigDecodeError("parameters", "must be an object")
    api_version = params.get("apiVersion")
    valid = [f"{GROUP}/{v}" for v in VERSIONS]
    if api_version not in valid:
        raise ConfigDecodeError(
            "apiVersion", f"{api_version!r} is not supported (supported: {', '.join(valid)})"
        )
    if params.get("kind") != KIND:
        raise ConfigDecodeError("kind", f"{params.get('kind')!r} is not {KIND!r}")
    unknown = sorted(set(params) - {"apiVersion", "kind", "env"})
    if unknown:
        raise ConfigDecodeError(unknown[0], "unknown field (known: apiVersion, kind, env)")
    env = params.get("env") or {}
    if not isinstance(env, Mapping):
        raise ConfigDecodeError("env", "must be a map of variable name to string value")
    if len(env) > _MAX_ENV:
        raise ConfigDecodeError("env", f"at most {_MAX_ENV} variables")
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigDecodeError(f"env.{name}", "not a valid environment variable name")
        if not isinstance(value, str):
            raise ConfigDecodeError(f"env.{name}", f"value must be a string, not {value!r}")
        out[name] = value
    return DeviceConfig(env=out)


def merge_configs(params: Iterable[Any]) -> DeviceConfig:
    """Decode parameters in precedence order (lowest first) and merge them."""
    result = DeviceConfig()
    for p in params:
        result = result.merged(decode_config(p))
    return result
