"""Our opaque device configuration, carried in claims and DeviceClasses.

A claim (or class) passes it as ``opaque: {driver: <our driver>, parameters: {...}}``::

    apiVersion: dra-agent.io/v1alpha1
    kind: DeviceConfig
    env:                      # extra environment for the containers using these devices
      NCCL_DEBUG: INFO
    denyEnv: ["NCCL_*"]       # DeviceClass configs only: names (or PREFIX*) no claim may set
    netdev:                   # NICs and VFs only; other devices ignore it
      move: true              # move the host interface into the pod (CDI 1.1.0 netDevices)
      interfaceName: net1     # its name inside the pod (default: its host name)
      addresses: [192.0.2.10/24]   # and mtu, hardwareAddress, routes, ethtool, rdma:
                              # the interface configured in the pod (docs/netdev.md)
    sharing:                  # shares of NVIDIA GPUs only (--sharing gpu=...)
      timeSlice: Long         # the GPU's time-slice interval: Default, Short, Medium, Long
      mps: true               # bound the share through the node's MPS control daemon
    vf:                       # VFs of --vfs dynamic only; other devices ignore it
      driver: vfio-pci        # bind the VF to vfio-pci, or netdev: its PF's kernel driver

Moving the interface is opt-in: without ``netdev.move: true`` the interface stays on the host
and the claim's CDI spec keeps a cdiVersion (<= 0.5.0) that older runtimes load. A runtime
without CDI 1.1.0 support refuses a spec with ``netDevices``, which is loud, but only useful
to users who asked for the move.

Decoding is strict, as Kubernetes is for its own types: an unknown field or a wrong
``kind``/``apiVersion`` is an error naming the field, instead of being silently ignored and
leaving the user wondering why the setting had no effect.

Configs merge in precedence order (class configs, then claim configs): ``env`` key by key,
``netdev`` field by field, so a class can turn the move on and a claim pick the name.

Environment is a privilege boundary: the container runtime reads some variables as orders
(nvidia-container-runtime honours ``NVIDIA_VISIBLE_DEVICES``, ``ld.so`` honours ``LD_PRELOAD``),
and anyone who may create a ResourceClaim writes its opaque config. So names are checked
strictly (a C identifier, nothing else), and a deny list (``DENIED_ENV_PREFIXES``, less the
harmless ``ALLOWED_ENV``) applies to every config, class or claim. A DeviceClass config may deny
more (``denyEnv``); nothing a claim says can allow a denied name. The agent's own variables
are added after the configs' (agent.prepare.cdispecs), so they win even against a name that
got past this list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.claim.writable import encodes
from agent.netdev.config import InterfaceConfig, NetconfError
from agent.netdev.config import check as check_interface
from agent.netdev.config import decode as decode_interface

GROUP = "dra-agent.io"
KIND = "DeviceConfig"
#: Versions this agent decodes; a newer one is refused with a message naming what we know.
VERSIONS = ("v1alpha1",)
# ASCII only and matched whole: ``$`` would accept a trailing newline, ``\w`` non-ASCII.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_MAX_ENV = 64
_MAX_ENV_NAME = 256
_MAX_ENV_VALUE = 32 * 1024
#: Names no opaque config may set: the runtime's device selection and driver capabilities
#: (``NVIDIA_VISIBLE_DEVICES=all`` hands out every GPU where nvidia-container-runtime honours
#: it), CUDA's (MPS limits of a shared GPU are the agent's to set), the dynamic loader's, and
#: the agent's own ``DRA_AGENT_*`` device description.
DENIED_ENV_PREFIXES = ("NVIDIA_", "CUDA_", "LD_", "DRA_AGENT_")
#: ``CUDA_`` variables that only tune the program itself and grant nothing.
ALLOWED_ENV = frozenset({
    "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_PATH", "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING",
})
_MAX_DENY = 64
#: Linux ``dev_valid_name``: 1-15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace, not . or ..
_IFNAME = re.compile(r"^[^/:\s]{1,15}$")
_TOP_FIELDS = ("apiVersion", "kind", "env", "denyEnv", "netdev", "sharing", "vf")
#: ``vf.driver`` values: the PF's own kernel driver (a netdev), or vfio-pci (a VFIO group).
VF_DRIVERS = ("netdev", "vfio-pci")
_NETDEV_FIELDS = ("move", "interfaceName", "addresses", "mtu", "hardwareAddress", "routes",
                  "ethtool", "rdma")
_SHARING_FIELDS = ("timeSlice", "mps")
#: ``nvidia-smi compute-policy --set-timeslice`` levels by name.
TIME_SLICES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class ConfigDecodeError(ValueError):
    """The opaque parameters are not a DeviceConfig we can use."""

    def __init__(self, field_path: str, message: str) -> None:
        # The path holds the claim's own keys: escaped when not printable, so the kubelet's
        # event and our log line stay one line.
        shown = field_path if field_path.isprintable() else ascii(field_path)
        super().__init__(f"opaque config field {shown}: {message}")
        self.field_path = field_path


@dataclass(frozen=True, slots=True)
class NetdevConfig:
    """What to do with a NIC's host interface. ``None`` fields are "not set here"."""

    move: bool | None = None
    interface_name: str | None = None
    #: What the interface gets inside the pod (``agent.netdev``); needs the move.
    interface: InterfaceConfig = field(default_factory=InterfaceConfig)

    def merged(self, later: NetdevConfig) -> NetdevConfig:
        return NetdevConfig(
            move=later.move if later.move is not None else self.move,
            interface_name=later.interface_name or self.interface_name,
            interface=self.interface.merged(later.interface),
        )


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """How a share of a GPU is bounded (``agent.prepare.effects``: timeslice, mps). ``None``:
    not set here."""

    time_slice: str | None = None
    mps: bool | None = None

    def merged(self, later: SharingConfig) -> SharingConfig:
        return SharingConfig(
            time_slice=later.time_slice or self.time_slice,
            mps=later.mps if later.mps is not None else self.mps,
        )

    @property
    def is_set(self) -> bool:
        return self.time_slice is not None or self.mps is not None


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    env: Mapping[str, str] = field(default_factory=dict)
    netdev: NetdevConfig = field(default_factory=NetdevConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    #: Extra denied names (``PREFIX*`` for a prefix), from DeviceClass configs only.
    deny_env: tuple[str, ...] = ()
    #: ``vf.driver``: what a VF made on demand is bound to (None: as the kernel made it).
    vf_driver: str | None = None

    @property
    def move_netdev(self) -> bool:
        return self.netdev.move is True

    @property
    def pod_interface_name(self) -> str | None:
        """The interface name inside the pod when the move is on (None: keep the host name)."""
        return self.netdev.interface_name if self.move_netdev else None

    def merged(self, later: DeviceConfig) -> DeviceConfig:
        """``later`` wins key by key (class config first, then claim config); deny lists add up."""
        return DeviceConfig(
            env={**self.env, **later.env},
            netdev=self.netdev.merged(later.netdev),
            sharing=self.sharing.merged(later.sharing),
            deny_env=(*self.deny_env, *(d for d in later.deny_env if d not in self.deny_env)),
            vf_driver=later.vf_driver or self.vf_driver,
        )


def env_denied(name: str, deny: Iterable[str] = ()) -> str | None:
    """Why ``name`` may not be set by an opaque config, or None when it may."""
    for pattern in deny:
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return f"denied by the DeviceClass config (denyEnv {pattern!r})"
    if name in ALLOWED_ENV:
        return None
    for prefix in DENIED_ENV_PREFIXES:
        if name.startswith(prefix):
            return (f"{prefix}* variables are set by the node's driver and the container "
                    "runtime, never by a claim or class config")
    return None


#: Names every pod already has: moving a NIC in under one of them fails or replaces the pod's
#: own network (the CNI's interface is eth0 nearly everywhere).
_POD_INTERFACES = (".", "..", "lo", "eth0")


def valid_interface_name(name: str) -> bool:
    return (bool(_IFNAME.fullmatch(name)) and name not in _POD_INTERFACES
            and name.isprintable() and len(name.encode()) <= 15)


def decode_config(params: Any, *, from_class: bool = False) -> DeviceConfig:
    """One config's parameters; ``from_class``: it comes from a DeviceClass (may set denyEnv)."""
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
    deny = _decode_deny(params.get("denyEnv"), from_class)
    return DeviceConfig(env=_decode_env(params.get("env")), netdev=_decode_netdev(params),
                        sharing=_decode_sharing(params.get("sharing")), deny_env=deny,
                        vf_driver=_decode_vf(params.get("vf")))


def _decode_sharing(raw: Any) -> SharingConfig:
    if raw is None:
        return SharingConfig()
    if not isinstance(raw, Mapping):
        raise ConfigDecodeError("sharing", "must be an object with timeSlice and mps")
    unknown = sorted(str(k) for k in set(raw) - set(_SHARING_FIELDS))
    if unknown:
        raise ConfigDecodeError(
            f"sharing.{unknown[0]}", f"unknown field (known: {', '.join(_SHARING_FIELDS)})")
    time_slice = raw.get("timeSlice")
    # isinstance first: ``[] in TIME_SLICES`` is a TypeError (a list is unhashable).
    if time_slice is not None and (not isinstance(time_slice, str)
                                   or time_slice not in TIME_SLICES):
        raise ConfigDecodeError("sharing.timeSlice",
                                f"{time_slice!r:.40} is not one of {', '.join(TIME_SLICES)}")
    mps = raw.get("mps")
    if mps is not None and not isinstance(mps, bool):
        raise ConfigDecodeError("sharing.mps", f"must be true or false, not {mps!r:.40}")
    return SharingConfig(time_slice=time_slice, mps=mps)


def _decode_vf(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigDecodeError("vf", "must be an object with driver")
    unknown = sorted(str(k) for k in set(raw) - {"driver"})
    if unknown:
        raise ConfigDecodeError(f"vf.{unknown[0]}", "unknown field (known: driver)")
    driver = raw.get("driver")
    if driver is not None and driver not in VF_DRIVERS:
        raise ConfigDecodeError(
            "vf.driver", f"{driver!r} is not a driver dra-agent binds VFs to "
                         f"(known: {', '.join(VF_DRIVERS)})")
    return driver if isinstance(driver, str) else None


def _decode_deny(raw: Any, from_class: bool) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not from_class:
        raise ConfigDecodeError(
            "denyEnv", "may only be set in a DeviceClass config, not in a claim's")
    if not isinstance(raw, list) or len(raw) > _MAX_DENY:
        raise ConfigDecodeError("denyEnv", f"must be a list of at most {_MAX_DENY} names")
    out: list[str] = []
    for i, entry in enumerate(raw):
        name = entry[:-1] if isinstance(entry, str) and entry.endswith("*") else entry
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigDecodeError(
                f"denyEnv[{i}]", f"{entry!r} is not a variable name or NAME_PREFIX*")
        out.append(entry)
    return tuple(out)


def _decode_env(env: Any) -> dict[str, str]:
    env = env or {}
    if not isinstance(env, Mapping):
        raise ConfigDecodeError("env", "must be a map of variable name to string value")
    if len(env) > _MAX_ENV:
        raise ConfigDecodeError("env", f"at most {_MAX_ENV} variables")
    out: dict[str, str] = {}
    for name, value in env.items():
        if (not isinstance(name, str) or len(name) > _MAX_ENV_NAME
                or not _ENV_NAME.fullmatch(name)):
            # A name with a newline or NUL is shown quoted: the log line stays one line.
            shown = name if isinstance(name, str) and name.isprintable() and name else repr(name)
            raise ConfigDecodeError(
                f"env.{shown}", "not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        why = env_denied(name)  # the built-in list; DeviceClass lists: merge_configs
        if why is not None:
            raise ConfigDecodeError(f"env.{name}", why)
        if not isinstance(value, str):
            raise ConfigDecodeError(f"env.{name}", f"value must be a string, not {value!r}")
        if "\0" in value or len(value) > _MAX_ENV_VALUE:
            raise ConfigDecodeError(
                f"env.{name}", f"value must be at most {_MAX_ENV_VALUE} characters, without NUL")
        if not value.isascii() and not encodes(value):
            # Parsing a claim refuses these first; a config decoded on its own must too.
            raise ConfigDecodeError(f"env.{name}", "value is not valid Unicode (a lone surrogate)")
        out[name] = value
    return out


def _decode_netdev(params: Mapping[str, Any]) -> NetdevConfig:
    raw = params.get("netdev")
    if raw is None:
        return NetdevConfig()
    if not isinstance(raw, Mapping):
        raise ConfigDecodeError("netdev", f"must be an object with {', '.join(_NETDEV_FIELDS)}")
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
                f"{name!r} is not a valid Linux interface name (1-15 bytes, no '/', ':', "
                "whitespace or control characters, not '.', '..', nor the pod's own 'lo' or "
                "'eth0')",
            )
        if move is False:
            # Said in the same breath as "do not move": the name could never take effect.
            raise ConfigDecodeError("netdev.interfaceName", "has no effect with move: false")
    try:
        interface = decode_interface(raw)
    except NetconfError as err:
        raise ConfigDecodeError(f"netdev.{err.field}", err.message) from None
    if move is False and interface.is_set:
        first = next(k for k in _NETDEV_FIELDS[2:] if raw.get(k) is not None)
        raise ConfigDecodeError(f"netdev.{first}", "has no effect with move: false")
    return NetdevConfig(move=move, interface_name=name, interface=interface)


def merge_configs(params: Iterable[Any], class_params: Iterable[Any] = ()) -> DeviceConfig:
    """Decode DeviceClass parameters, then claim parameters, each in precedence order (lowest
    first), and merge them. Every class's ``denyEnv`` applies to every config, the class's own
    included, so a claim config can never set what any class denies."""
    classes = [decode_config(p, from_class=True) for p in class_params]
    result = DeviceConfig()
    for config in [*classes, *(decode_config(p) for p in params)]:
        result = result.merged(config)
    if result.deny_env:
        for name in result.env:  # every name any config set, checked against every class list
            why = env_denied(name, result.deny_env)
            if why is not None:
                raise ConfigDecodeError(f"env.{name}", why)
    _check_netdev(result.netdev)
    return result


def _check_netdev(netdev: NetdevConfig) -> None:
    """The interface's fields together, once every config is merged in (a class's MTU, a
    claim's addresses); none of them means anything unless the interface moves."""
    if not netdev.interface.is_set:
        return
    if netdev.move is not True:
        raise ConfigDecodeError("netdev", "addresses, mtu, hardwareAddress, routes, ethtool "
                                          "and rdma configure the interface in the pod: they "
                                          "need move: true")
    try:
        check_interface(netdev.interface)
    except NetconfError as err:
        raise ConfigDecodeError(f"netdev.{err.field}", err.message) from None
