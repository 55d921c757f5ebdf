"""The options every command shares: one flag and one ``DRA_AGENT_*`` variable per Config
field, and ``pop_config``, which turns a command's values into its Config.

A command takes only the shared options it reads (``shared_options("kubelet_dir", ...)``), so
its help lists those alone; a config file may still hold every key (one file serves every
command), and agent/commands/configfile.py checks them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any, TypeVar

import click

from agent.commands.configfile import ConfigError, merge
from agent.common.config import DEFAULT_DRIVER, MIG_MODES, NUMA_NODE_FORMS, VF_MODES, Config

ENV_PREFIX = "DRA_AGENT_"

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
    (("--gpu-passthrough",), {
        "is_flag": True, "default": None,
        "help": "also offer every whole GPU as its VFIO form (type vfio, class "
                "vfio.dra-agent.io), bound to vfio-pci at prepare for a VM (KubeVirt) "
                "and given back its driver at unprepare [default: off]"}),
    (("--metrics-address",), {"help": "host:port of metrics and health [default: 127.0.0.1:9464]"}),
    (("--config", "config_file"), {"help": "YAML config file", "type": click.Path()}),
    (("--log-format",), {"type": click.Choice(["logfmt", "json"])}),
    (("-v", "--verbose", "verbosity"), {"count": True, "help": "more logs (-vv: debug)"}),
]


class _SimulateOption(click.Option):
    """``--simulate``, whose help names the profiles. They are looked up only when help is
    shown: the simulator is not imported by a command that runs on real hardware."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        # Lazy: the profiles are the simulator's, needed for help text alone.
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
    cfg, from_file = merge(values, own, aliases)
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
