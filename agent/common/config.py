"""Options shared by every command: flags, ``DRA_AGENT_*`` env vars and a YAML file.

Precedence is flags > environment > config file > built-in default. Click resolves the first
two (each option has ``envvar``); the file fills in whatever is still unset.
"""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from discovery.sharing import SharingMode, parse_sharing_list
from discovery.vfs import parse_vf_rate, rate_quantity

if TYPE_CHECKING:
    from discovery.scan import DiscoveryOptions

ENV_PREFIX = "DRA_AGENT_"
DEFAULT_DRIVER = "dra-agent.io"
ALL_DEVICE_TYPES = ("gpu", "mig", "nic", "vf")
NUMA_NODE_FORMS = ("auto", "list", "scalar")  # agent/slices/listattrs.py: what each means
MIG_MODES = ("static", "dynamic")  # discovery/partitions.py: what dynamic publishes
VF_MODES = ("static", "dynamic")  # discovery/vfs.py


class ConfigError(click.UsageError):
    """A configuration value or file that cannot be used; exit code 2 like other usage errors."""


@dataclass(frozen=True, slots=True)
class Config:
    driver_name: str = DEFAULT_DRIVER
    node_name: str = ""
    #: A kubeconfig path, "none" for no API server, or "" for in-cluster -> KUBECONFIG -> ~/.kube.
    kubeconfig: str = ""
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    sysfs_root: Path = Path("/sys")
    simulate: str | None = None
    #: With ``simulate``: stand-in device nodes (1:3) for the simulated devices, made under
    #: ``simulated_dev_dir`` for a real container runtime to inject (``cdi.simnodes``).
    simulate_device_nodes: bool = False
    metrics_address: str = "127.0.0.1:9464"
    log_format: str = "logfmt"
    verbosity: int = 0
    device_types: tuple[str, ...] = ALL_DEVICE_TYPES
    #: numaNode as an int list (1.37 DRAListTypeAttributes) or an int; auto asks the server.
    numa_node_attribute: str = "auto"
    #: Device types published shareable (``--sharing gpu=shares:4``), discovery/sharing.py.
    sharing: tuple[SharingMode, ...] = ()
    #: static: offer the MIG instances that exist; dynamic: every partition, made at prepare.
    mig: str = "static"
    #: static: offer the VFs that exist; dynamic: a PF without VFs offers them, made on use.
    vfs: str = "static"
    #: With vfs=dynamic: what each VF is guaranteed of its PF's link ("25G"), discovery/vfs.py.
    vf_bandwidth: str | None = None
    config_file: Path | None = None

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def simulated_dev_dir(self) -> Path:
        """Where ``simulate_device_nodes`` makes the stand-ins: in the plugin directory, which
        the DaemonSet mounts from the host at the same path, so the runtime finds them."""
        from cdi.simnodes import SUBDIR

        return self.plugin_dir / SUBDIR

    @property
    def simulated_faults_dir(self) -> Path:
        """The inbox of a ``--simulate`` agent, where ``dra-agent simulate fault`` leaves its
        requests (``agent.simfaults``): in the plugin directory, which the pod sees too."""
        from agent.simfaults.layout import INBOX_SUBDIR

        return self.plugin_dir / INBOX_SUBDIR

    def discovery_options(self, **more: Any) -> DiscoveryOptions:
        """What discovery offers under this config (``more``: what only a running agent
        knows, its node addresses and the MIG instances it made). One place, so ``run``, its
        rescans and ``discover`` never offer different devices."""
        from discovery.scan import DiscoveryOptions

        return DiscoveryOptions(
            device_types=self.device_types, sharing=self.sharing, mig=self.mig, vfs=self.vfs,
            vf_bandwidth_mbps=parse_vf_rate(self.vf_bandwidth) if self.vf_bandwidth else None,
            **more)


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0].lower()


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
    return rate_quantity(parse_vf_rate(_text(value)))


def _sharing(value: Any) -> tuple[SharingMode, ...]:
    if isinstance(value, SharingMode):
        return (value,)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, SharingMode) for v in value):
            return tuple(value)
        items = [str(v) if isinstance(v, str) else _kind(v) for v in value]
    elif isinstance(value, str):
        items = value.split()  # DRA_AGENT_SHARING="gpu=shares:4 nic=bandwidth"
    else:
        raise ValueError(f"expected TYPE=MODE strings, got {_kind(value)}")
    return parse_sharing_list(items)


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
    "metrics_address": _text,
    "log_format": _text,
    "config_file": _path,
    "verbosity": _verbosity,
    "device_types": _parse_device_types,
    "sharing": _sharing,
}

#: A config file is a few lines; anything bigger is the wrong file (a log, a disk image).
MAX_CONFIG_BYTES = 1 << 20


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
            near = difflib.get_close_matches(str(key).replace("_", "-"), spellings, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ConfigError(f"config file {path}: unknown key {str(key)[:60]!r}{hint} "
                              "('dra-agent config example' lists every key)")
        out[name] = value
    return out


def build_config(values: dict[str, Any]) -> Config:
    """Merge click values (None = not given by flag or env) with the file and the defaults."""
    return _merge(values, frozenset())[0]


def _merge(values: dict[str, Any], extra_keys: frozenset[str],
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


F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--driver-name",), {"help": f"DRA driver name [default: {DEFAULT_DRIVER}]"}),
    (("--node-name",), {"help": "Node name [default: NODE_NAME, else the hostname]"}),
    (
        ("--kubeconfig",),
        {"help": "kubeconfig path, or 'none' [default: in-cluster, KUBECONFIG, ~/.kube/config]"},
    ),
    (("--kubelet-dir",), {"help": "kubelet root dir [default: /var/lib/kubelet]"}),
    (("--cdi-dir",), {"help": "CDI spec dir [default: /var/run/cdi]"}),
    (("--sysfs-root",), {"help": "sysfs mount point [default: /sys]"}),
    (("--simulate",), {"metavar": "PROFILE", "help": "run on simulated hardware"}),
    (("--simulate-device-nodes",), {
        "is_flag": True, "default": None,
        "help": "with --simulate: give each simulated device the device nodes the real one "
                "has (/dev/nvidia0...), as harmless stand-ins (character devices 1:3, as "
                "/dev/null) the agent makes under <kubelet-dir>/plugins/<driver-name>/"
                "simulated-dev, so a real container runtime can inject them (needs "
                "CAP_MKNOD) [default: env entries only]"}),
    (("--device-types",), {"help": "comma-separated subset of gpu,mig,nic,vf [default: all]"}),
    (("--numa-node-attribute",), {
        "type": click.Choice(NUMA_NODE_FORMS),
        "help": "numaNode as an int list (needs DRAListTypeAttributes) or an int; auto asks "
                "the API server [default: auto]"}),
    (("--sharing",), {
        "multiple": True, "metavar": "TYPE=MODE",
        "help": "publish a device type shareable: gpu=shares:N, gpu=memory[:STEP], "
                "nic=shares:N, nic=bandwidth[:STEP] (repeatable) [default: exclusive]"}),
    (("--mig",), {
        "type": click.Choice(MIG_MODES),
        "help": "MIG: offer the instances that exist, or every partition a MIG-mode GPU has "
                "room for, created at prepare [default: static]"}),
    (("--vfs",), {
        "type": click.Choice(VF_MODES),
        "help": "SR-IOV: offer the VFs that exist, or, for a PF without VFs, the VFs it can "
                "have, created (all, once) at the first prepare [default: static]"}),
    (("--vf-bandwidth",), {
        "metavar": "RATE",
        "help": "with --vfs dynamic: guarantee each VF RATE (bit/s: 25G, 2500M) of its PF's "
                "link; the scheduler hands out only as many as the link carries, prepare "
                "caps each VF at RATE [default: VFs counted only]"}),
    (("--metrics-address",), {"help": "host:port of metrics and health [default: 127.0.0.1:9464]"}),
    (("--config", "config_file"), {"help": "YAML config file", "type": click.Path()}),
    (("--log-format",), {"type": click.Choice(["logfmt", "json"])}),
    (("-v", "--verbose", "verbosity"), {"count": True, "help": "more logs (-vv: debug)"}),
]


class _SimulateOption(click.Option):
    """``--simulate``, whose help names the profiles. They are looked up only when help is
    shown: the simulator is not imported by a command that runs on real hardware."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from discovery.simulate.profiles import PROFILES

        self.help = f"run on simulated hardware; PROFILE is one of {', '.join(sorted(PROFILES))}"
        return super().get_help_record(ctx)


def _dest(decls: tuple[str, ...]) -> str:
    last = decls[-1]
    return last if not last.startswith("-") else last.lstrip("-").replace("-", "_")


#: The shared options by the Config field each one sets, in the order help lists them.
SHARED_OPTIONS: tuple[str, ...] = tuple(_dest(decls) for decls, _ in _OPTIONS)


def shared_options(*names: str) -> Callable[[F], F]:
    """Add the named shared options (Config field names, e.g. ``kubelet_dir``), each with its
    ``DRA_AGENT_<NAME>`` env var, so that a command's help lists only the options it reads.

    A config file may still hold the keys of options a command does not take (one file serves
    every command); they are checked and left unused.
    """
    unknown = sorted(set(names) - set(SHARED_OPTIONS))
    if unknown:  # a typo in a command module, found when it is imported
        raise ValueError(f"not shared options: {', '.join(unknown)}")

    def decorate(func: F) -> F:
        for decls, kwargs in reversed(_OPTIONS):
            dest = _dest(decls)
            if dest not in names:
                continue
            env = ENV_PREFIX + (dest if dest != "config_file" else "config").upper()
            cls = _SimulateOption if dest == "simulate" else click.Option
            func = click.option(*decls, cls=cls, envvar=env, show_envvar=True, **kwargs)(func)
        return func

    return decorate


def common_options(func: F) -> F:
    """Add every shared option: for ``run``, which reads them all."""
    return shared_options(*SHARED_OPTIONS)(func)


def pop_config(kwargs: dict[str, Any]) -> Config:
    """Take the shared options out of a command's kwargs and build the Config.

    The config file may also set the command's own options (``rolling_update: true`` for
    ``run``); those fill ``kwargs`` where neither a flag nor the environment gave a value.
    """
    names = {f.name for f in fields(Config)}
    values = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    if values.get("verbosity") == 0:
        values["verbosity"] = None  # count options report 0 when absent
    ctx = click.get_current_context(silent=True)
    params = {p.name: p for p in ctx.command.params if p.name} if ctx is not None else {}
    own = frozenset(k for k in params if k in kwargs)
    aliases = own_aliases(params.values())
    cfg, from_file = _merge(values, own, aliases)
    spelling = {name: alias.replace("_", "-") for alias, name in aliases.items()}
    for key, raw in from_file.items():
        if ctx is not None and ctx.get_parameter_source(key) is click.core.ParameterSource.DEFAULT:
            try:
                kwargs[key] = params[key].type_cast_value(ctx, raw)
            except click.BadParameter as err:
                raise ConfigError(f"config file {cfg.config_file}: {spelling.get(key, key)}: "
                                  f"{err.message}") from err
    return cfg


def own_aliases(params: Iterable[click.Parameter]) -> dict[str, str]:
    """A command's options by the snake_case of their long flag (``shutdown_grace`` for
    ``--shutdown-grace``, whose option name is ``shutdown_grace_s``; ``verbose`` for
    ``verbosity``), so a config file can use the spelling the help shows."""
    out: dict[str, str] = {}
    for param in params:
        for opt in getattr(param, "opts", ()):
            if opt.startswith("--") and param.name:
                out[opt[2:].replace("-", "_")] = param.name
    return out
