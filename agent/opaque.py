"""Our opaque device configuration, carried in claims and DeviceClasses.

A claim (or class) passes it as ``opaque: {driver: <our driver>, parameters: {...}}``::

    apiVersion: dra-agent.io/v1alpha1
    kind: DeviceConfig
    env:                      # extra environment for the containers using these devices
      NCCL_DEBUG: INFO
    netdev:                   # NICs and VFs only; other devices ignore it
      move: true              # move the host interface into the pod (CDI 1.1.0 netDevices)
      interfaceName: net1     # its name inside the pod (default: its host name)

Moving the interface is opt-in: without ``netdev.move: true`` the interface stays on the host
and the claim's CDI spec keeps a cdiVersion (<= 0.5.0) that older runtimes load. A runtime
without CDI 1.1.0 support refuses a spec with ``netDevices``, which is loud, but only useful
to users who asked for the move.

Decoding is strict, as Kubernetes is for its own types: an unknown field or a wrong
``kind``/``apiVersion`` is an error naming the field, instead of being silently ignored and
leaving the user wondering why the setting had no effect.

Configs merge in precedence order (class configs, then claim configs): ``env`` key by key,
``netdev`` field by field, so a class can turn the move on and a claim pick the name.
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
#: Linux ``dev_valid_name``: 1-15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace, not . or ..
_IFNAME = re.compile(r"^[^/:\s]{1,15}$")
_TOP_FIELDS = ("apiVersion", "kind", "env", "netdev")
_NETDEV_FIELDS = ("move", "interfaceName")


class ConfigDecodeError(ValueError):
    """The opaque parameters are not a DeviceConfig we can use."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"opaque config field {field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True, slots=True)
class NetdevConfig:
    """What to do with a NIC's host interface. ``None`` fields are "not set here"."""

    move: bool | None = None
    interface_name: str | None = None

    def merged(self, later: NetdevConfig) -> NetdevConfig:
        return NetdevConfig(
            move=later.move if later.move is not None else self.move,
            interface_name=later.interface_name or self.interface_name,
        )


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    env: Mapping[str, str] = field(default_factory=dict)
    netdev: NetdevConfig = field(default_factory=NetdevConfig)

    @property
    def move_netdev(self) -> bool:
        return self.netdev.move is True

    @property
    def pod_interface_name(self) -> str | None:
        """The interface name inside the pod when the move is on (None: keep the host name)."""
        return self.netdev.interface_name if self.move_netdev else None

    def merged(self, later: DeviceConfig) -> DeviceConfig:
        """``later`` wins key by key (class config first, then claim config)."""
        return DeviceConfig(env={**self.env, **later.env}, netdev=self.netdev.merged(later.netdev))


def valid_interface_name(name: str) -> bool:
    return bool(_IFNAME.fullmatch(name)) and name not in (".", "..") and len(name.encode()) <= 15


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
    unknown = sorted(str(k) for k in set(params) - set(_TOP_FIELDS))
    if unknown:
        raise ConfigDecodeError(unknown[0], f"unknown field (known: {', '.join(_TOP_FIELDS)})")
    return DeviceConfig(env=_decode_env(params.get("env")), netdev=_decode_netdev(params))


def _decode_env(env: Any) -> dict[str, str]:
    env = env or {}
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
    return out


def _decode_netdev(params: Mapping[str, Any]) -> NetdevConfig:
    raw = params.get("netdev")
    if raw is None:
        return NetdevConfig()
    if not isinstance(raw, Mapping):
        raise ConfigDecodeError("netdev", "must be an object with move and interfaceName")
    unknown = sorted(str(k) for k in set(raw) - set(_NETDEV_FIELDS))
    if unknown:
        raise ConfigDecodeError(
            f"netdev.{unknown[0]}", f"unknown field (known: {', '.join(_NETDEV_FIELDS)})"
        )
    move = raw.get("move")
    if move is not None and not isinstance(move, bool):
        raise ConfigDecodeError("netdev.move", f"must be true or false, not {move!r}")
    name = raw.get("interfaceName")
    if name is not None:
        if not isinstance(name, str) or not valid_interface_name(name):
            raise ConfigDecodeError(
                "netdev.interfaceName",
                f"{name!r} is not a valid Linux interface name (1-15 bytes, no '/', ':' or "
                "whitespace, not '.' or '..')",
            )
        if move is False:
            # Said in the same breath as "do not move": the name could never take effect.
            raise ConfigDecodeError("netdev.interfaceName", "has no effect with move: false")
    return NetdevConfig(move=move, interface_name=name)


def merge_configs(params: Iterable[Any]) -> DeviceConfig:
    """Decode parameters in precedence order (lowest first) and merge them."""
    result = DeviceConfig()
    for p in params:
        result = result.merged(decode_config(p))
    return result
