"""``dra-agent doctor``: why pods on this node would not get their devices.

Checks the container runtime, the kubelet, the API server, other device drivers, the hardware
and the agent itself, reading the host's files under ``--host-root`` (read-only) and asking the
API server when a client can be built. Exit 0 when nothing fails (warnings included), 1 when a
check fails, 2 for bad input; a check that cannot read what it needs warns, in one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import click

from agent.commands.options import pop_config, shared_options
from agent.common.config import Config
from agent.common.logs import setup_logging

if TYPE_CHECKING:
    from agent.doctor.context import Context, Http, Options
    from agent.doctor.host import HostRoot
    from discovery.model import Inventory
    from discovery.sources import Sources


@click.command()
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--host-root", default=None, metavar="DIR", envvar="DRA_AGENT_HOST_ROOT",
              show_envvar=True,
              help="The host's / (in a pod: mounted read-only) [default: /; --simulate: a "
                   "generated healthy node]")
@shared_options("driver_name", "node_name", "kubeconfig", "kubelet_dir", "cdi_dir", "simulate",
                "device_types", "sharing", "gpu_passthrough", "metrics_address", "config_file",
                "log_format", "verbosity")
def command(**kwargs: Any) -> None:
    """Check why pods on this node would not get their devices.

    Exit 0 when no check fails (warnings included), 1 when one does, 2 for bad input.
    """
    # Lazy, as every import of this command's functions: the checks, discovery and the API
    # client (a fifth of a second) load when the command runs, not for its -h.
    from agent.doctor.render import to_json, to_table
    from agent.doctor.runner import exit_code, run_checks

    # The own options stay in kwargs until pop_config: a config file may set them too.
    cfg = pop_config(kwargs)
    output: str = kwargs["output"]
    host_root: str | None = kwargs["host_root"]
    setup_logging(cfg.log_format, cfg.verbosity)
    root = _host_root(host_root, cfg)
    api, skip, error = _api(cfg)
    with _context(cfg, root, api, skip, error) as ctx:
        checks = run_checks(ctx)
    click.echo(to_json(checks) if output == "json" else to_table(checks))
    raise SystemExit(exit_code(checks))


def _host_root(value: str | None, cfg: Config) -> Path | None:
    """The host root to read, or None for a simulated node (its root is generated)."""
    if cfg.simulate:
        if value is not None:
            raise click.UsageError("--simulate generates its own host root; drop --host-root")
        return None
    text = "/" if value is None else value
    if not text or "\0" in text:
        raise click.UsageError("--host-root: expected a directory path")
    path = Path(text)
    if not path.is_dir():
        why = "not a directory" if path.exists() else "no such directory"
        raise click.UsageError(f"--host-root: {text}: {why}")
    return path


def _api(cfg: Config) -> tuple[Http | None, str, str]:
    """(client, why there is none, why the configured one is unusable)."""
    from agent.kube.client import KubeConfigError, api_client, resolve_source

    value = cfg.kubeconfig.strip()
    if value.lower() == "none":
        return None, "--kubeconfig none: no API server", ""
    if cfg.simulate and not value:
        # A simulated node is not in any cluster: the default kubeconfig would compare it
        # with whatever cluster ~/.kube/config names.
        return None, f"simulated node {cfg.simulate}: give --kubeconfig to check a cluster", ""
    if value:
        path = Path(value).expanduser()
        if not path.is_file():
            why = "not a regular file" if path.exists() else "no such file"
            raise click.UsageError(f"--kubeconfig: {value}: {why}")
    else:
        source = resolve_source(value)
        if source.kind == "kubeconfig" and source.path is not None and \
                not source.path.is_file():
            return None, (f"no credentials: not in a pod, no KUBECONFIG, no {source.path} "
                          "(--kubeconfig PATH to check the cluster)"), ""
    try:
        client = api_client(cfg)
    except KubeConfigError as err:
        return None, "", " ".join(str(err).split())[:300]
    return client, "", ""


def _options(cfg: Config) -> Options:
    from agent.doctor.context import Options

    return Options(driver_name=cfg.driver_name, node_name=cfg.node_name,
                   kubelet_dir=PurePosixPath("/", cfg.kubelet_dir),
                   cdi_dir=PurePosixPath("/", cfg.cdi_dir),
                   metrics_address=cfg.metrics_address, device_types=cfg.device_types)


@contextlib.contextmanager
def _context(cfg: Config, root: Path | None, api: Http | None, skip: str,
             error: str) -> Iterator[Context]:
    from agent.doctor.context import Context
    from agent.doctor.host import HostRoot
    from agent.inventory import discovery_options
    from discovery.scan import discover

    options = _options(cfg)
    wants_nvml = bool({"gpu", "mig"} & set(cfg.device_types))

    def make(host: HostRoot, sources: Sources) -> Context:
        def run_discovery() -> Inventory:
            return discover(sources, discovery_options(cfg))

        return Context(host=host, options=options, api=api, api_skip=skip, api_error=error,
                       discover=run_discovery, gpu=sources.gpu if wants_nvml else None,
                       simulated=cfg.simulate or "")

    if root is not None:
        host = HostRoot(root)
        yield make(host, _host_sources(host))
        return
    from agent.doctor.simulate import healthy_host_root
    from discovery.simulate import ProfileError, scratch_dir

    assert cfg.simulate is not None
    with scratch_dir() as tmp:
        try:
            sources = healthy_host_root(cfg.simulate, Path(tmp), options)
        except ProfileError as err:
            raise click.UsageError(str(err)) from err
        yield make(HostRoot(Path(tmp)), sources)


def _host_sources(host: HostRoot) -> Sources:
    """Discovery's sources for the host root. A pod mounting the host's / does not get its
    /proc and /dev (separate mounts): the pod's own stand in (hostNetwork: the same routes)."""
    from agent.doctor.host import HostFileError
    from discovery.host import host_sources

    try:
        proc, dev, sysfs = host.path("/proc"), host.path("/dev"), host.path("/sys")
    except HostFileError as err:  # a link chain the kernel would refuse: no host to read
        raise click.UsageError(f"--host-root: {err}") from err
    return host_sources(sysfs_root=sysfs,
                        proc_root=proc if (proc / "net").is_dir() else Path("/proc"),
                        dev_root=dev if any(dev.glob("*")) else Path("/dev"))
