"""A Config from a command's values and the YAML config file, every value checked.

Precedence is flags > environment > config file > built-in default. Click resolves the first
two (each shared option has ``envvar``, agent/commands/options.py); the file fills in whatever
is still unset. Each value is checked here, whoever gave it, and a bad one is a usage error
naming the flag or the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import click

from agent.common.config import (
    ALL_DEVICE_TYPES,
    MIG_MODES,
    NUMA_NODE_FORMS,
    VF_MODES,
    Config,
    default_node_name,
)

#: A config file is a few lines; anything bigger is the wrong file (a log, a disk image).
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(click.UsageError):
    """A configuration value or file that cannot be used; exit code 2 like other usage errors."""


def _parse_device_types(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    types = tuple(str(t).strip() for t in items if str(t).strip())
    unknown = sorted(set(types) - set(ALL_DEVICE_TYPES))
    if unknown:  # _convert says whose value it was
        raise ValueError(
            f"unknown device type(s) {', '.join(unknown)}; known: {', '.join(ALL_DEVICE_TYPES)}"
        )
    return types


def _numa_form(value: Any) -> str:
    if value not in NUMA_NODE_FORMS:
        raise ValueError(f"expected one of {', '.join(NUMA_NODE_FORMS)}, got {_kind(value)}")
    return str(value)


def _mig_mode(value: Any) -> str:
    text = _text(value)
    if text not in MIG_MODES:
        raise ValueError(f"must be one of {', '.join(MIG_MODES)}, not {text!r}")
    return text


def _vf_mode(value: Any) -> str:
    text = _text(value)
    if text not in VF_MODES:
        raise ValueError(f"must be one of {', '.join(VF_MODES)}, not {text!r}")
    return text


def _vf_bandwidth(value: Any) -> str:
    # Lazy, as below: discovery's parsers load only for a value given (``dra-agent run`` serves
    # the kubelet's sockets right after its options are read).
    from discovery.vfs import parse_vf_rate, rate_quantity

    return rate_quantity(parse_vf_rate(_text(value)))


def _sharing(value: Any) -> tuple[str, ...]:
    """Each mode in the spelling discovery prints (and parses back): Config holds text."""
    from discovery.sharing import SharingMode, parse_sharing_list

    if isinstance(value, SharingMode):
        return (str(value),)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, SharingMode) for v in value):
            return tuple(str(v) for v in value)
        items = [str(v) if isinstance(v, str) else _kind(v) for v in value]
    elif isinstance(value, str):
        items = value.split()  # DRA_AGENT_SHARING="gpu=shares:4 nic=bandwidth"
    else:
        raise ValueError(f"expected TYPE=MODE strings, got {_kind(value)}")
    return tuple(str(mode) for mode in parse_sharing_list(items))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):  # "yes" or 1 in a file is a typo, not a choice
        raise ValueError(f"expected true or false, got {_kind(value)}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_kind(value)}")
    return value


def _path(value: Any) -> Path:
    text = _text(value)
    try:
        # A NUL, or an unpaired surrogate from YAML's "\ud800", names no file: the first
        # open() would raise ValueError deep in the start-up.
        usable = bool(text) and "\0" not in text and bool(os.fsencode(text))
    except UnicodeEncodeError:
        usable = False
    if not usable:
        raise ValueError("expected a path")
    return Path(text)


def _verbosity(value: Any) -> int:
    # bool is an int to Python; "verbosity: yes" is not a level.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a whole number >= 0, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)[:40]
    return f"a {type(value).__name__}"


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "driver_name": _text,
    "node_name": _text,
    "kubeconfig": _text,
    "kubelet_dir": _path,
    "cdi_dir": _path,
    "sysfs_root": _path,
    "simulate": _text,
    "simulate_device_nodes": _bool,
    "numa_node_attribute": _numa_form,
    "mig": _mig_mode,
    "vfs": _vf_mode,
    "vf_bandwidth": _vf_bandwidth,
    "gpu_passthrough": _bool,
    "metrics_address": _text,
    "log_format": _text,
    "config_file": _path,
    "verbosity": _verbosity,
    "device_types": _parse_device_types,
    "sharing": _sharing,
}


def _convert(key: str, value: Any, where: str) -> Any:
    try:
        return _CONVERTERS.get(key, lambda v: v)(value)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}{key.replace('_', '-')}: {err}") from err


def _load_file(path: Path, extra_keys: frozenset[str] = frozenset(),
               aliases: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file's values by option name. A key is the option's name or its flag's spelling
    (``driver-name``, ``shutdown-grace``); ``aliases`` maps a command's own flag spellings
    (snake_case) to their option names."""
    import yaml  # only when a file is given

    try:
        if path.exists() and not path.is_file():  # a FIFO would block the read forever
            raise ConfigError(f"config file {path}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"config file {path}: {err.strerror or err}") from err
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; "
                          "is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte 0x{raw[err.start]:02x} "
                          f"at offset {err.start}); give a YAML file") from err
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: not valid YAML: "
                          f"{' '.join(str(err).split())}") from err
    except RecursionError as err:
        raise ConfigError(f"config file {path}: nested too deeply to be a config") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    aliases = {**dict(aliases or {}), "config": "config_file"}
    known = {f.name for f in fields(Config)} | extra_keys
    # Accept both snake_case and the flag spelling (driver-name).
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        name = aliases.get(name, name)
        if name not in known:
            spellings = sorted({k.replace("_", "-") for k in known | set(aliases)})
            import difflib  # only for a misspelt key

            near = difflib.get_close_matches(str(key).replace("_", "-"), spellings, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ConfigError(f"config file {path}: unknown key {str(key)[:60]!r}{hint} "
                              "('dra-agent config example' lists every key)")
        out[name] = value
    return out


def build_config(values: dict[str, Any]) -> Config:
    """Merge click values (None = not given by flag or env) with the file and the defaults."""
    return merge(values, frozenset())[0]


def merge(values: dict[str, Any], extra_keys: frozenset[str],
          aliases: Mapping[str, str] | None = None) -> tuple[Config, dict[str, Any]]:
    """The Config, plus the file's values for ``extra_keys`` (a command's own options)."""
    given = {k: v for k, v in values.items() if v is not None and v != ()}
    file_path = given.get("config_file")
    converted: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if file_path:
        from_file = _load_file(Path(file_path), extra_keys, aliases)
        extra = {k: v for k, v in from_file.items() if k in extra_keys}
        # Every value the file sets is checked, also those a flag overrides: a wrong file is
        # found now, not when the flag is dropped. "key:" (null) leaves the default.
        converted.update({k: _convert(k, v, f"config file {file_path}: ")
                          for k, v in from_file.items() if k not in extra_keys and v is not None})
    converted.update({k: _convert(k, v, "") for k, v in given.items()})
    cfg = replace(Config(), **converted)
    if not cfg.node_name:
        cfg = replace(cfg, node_name=default_node_name())
    if cfg.log_format not in ("logfmt", "json"):
        raise ConfigError(f"--log-format must be logfmt or json, not {cfg.log_format!r}")
    if cfg.simulate_device_nodes and not cfg.simulate:
        raise ConfigError("--simulate-device-nodes needs --simulate: it makes stand-in nodes "
                          "for simulated devices; real devices have their own")
    if cfg.vf_bandwidth is not None and cfg.vfs != "dynamic":
        raise ConfigError("--vf-bandwidth needs --vfs dynamic: a VF's share of the link is "
                          "guaranteed only where the agent hands VFs out from a counter set")
    return cfg, extra
