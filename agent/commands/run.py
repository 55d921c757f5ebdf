"""``dra-agent run``: the daemon.

SIGTERM/SIGINT stop it cleanly (in-flight calls finish within the grace period, sockets are
removed, ResourceSlices are kept); a second signal exits at once.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from agent.commands.options import common_options, pop_config
from agent.common.logs import setup_logging

if TYPE_CHECKING:
    from agent.daemon.daemon import Daemon
    from agent.health import HealthOptions

#: Exit code of a second signal: the conventional 128 + SIGINT.
FORCED_EXIT = 130


def _health_options(kwargs: dict[str, Any]) -> HealthOptions | None:
    # Lazy, as the daemon below: `config example` and `run -h` read this module's options
    # without loading the agent (half a second: gRPC, NVML, the health monitor); the options
    # alone, not the monitor: they are read before the kubelet's sockets are served.
    from agent.health.options import HealthConfigError, HealthOptions, parse_effects, parse_xids

    if not kwargs["health"]:
        return None
    try:
        options = HealthOptions(quiet_period_s=kwargs["health_quiet_period"],
                                effects=parse_effects(kwargs["health_taint_effects"]))
        if kwargs["health_ignore_xids"] is not None:
            options = replace(options, ignored_xids=parse_xids(kwargs["health_ignore_xids"]))
    except HealthConfigError as err:
        raise click.UsageError(str(err)) from err
    return options


@click.command()
@click.option("--rolling-update/--no-rolling-update", default=False, show_default=True,
              envvar="DRA_AGENT_ROLLING_UPDATE", show_envvar=True,
              help="Per-pod socket names and a cross-instance lock (DaemonSet maxSurge, "
                   "kubelet >= 1.33).")
@click.option("--pod-uid", envvar=["DRA_AGENT_POD_UID", "POD_UID"], show_envvar=True,
              help="This pod's UID (downward API), for rolling-update socket names.")
@click.option("--shutdown-grace", "shutdown_grace_s", type=float, default=10.0,
              show_default=True, envvar="DRA_AGENT_SHUTDOWN_GRACE", show_envvar=True,
              help="Seconds in-flight calls get to finish on SIGTERM.")
@click.option("--rescan-interval", "slow_rescan_s", type=float, default=60.0, show_default=True,
              envvar="DRA_AGENT_RESCAN_INTERVAL", show_envvar=True,
              help="Seconds between full rescans (catches MIG changes; udev covers hotplug).")
@click.option("--driver-root", type=click.Path(file_okay=False), default="/",
              show_default=True, envvar="DRA_AGENT_DRIVER_ROOT", show_envvar=True,
              help="Where the NVIDIA driver installation is mounted (e.g. /driver-root in a pod).")
@click.option("--host-driver-root", type=click.Path(file_okay=False), default="/",
              show_default=True, envvar="DRA_AGENT_HOST_DRIVER_ROOT", show_envvar=True,
              help="The same driver installation as the container runtime sees it on the host "
                   "(e.g. /run/nvidia/driver for a containerised driver).")
@click.option("--boot-id-file", type=click.Path(dir_okay=False),
              default="/proc/sys/kernel/random/boot_id", show_default=True,
              envvar="DRA_AGENT_BOOT_ID_FILE", show_envvar=True, hidden=True,
              help="Where the Linux boot ID is read (tests simulate a reboot with it).")
@click.option("--health/--no-health", default=True, show_default=True,
              envvar="DRA_AGENT_HEALTH", show_envvar=True,
              help="Monitor device health: taint faulty devices, serve the kubelet's stream.")
@click.option("--health-ignore-xids", default=None, envvar="DRA_AGENT_HEALTH_IGNORE_XIDS",
              show_envvar=True,
              help="Xids that are not device faults [default: 13,31,43,45,68,109].")
@click.option("--health-quiet-period", type=float, default=60.0, show_default=True,
              envvar="DRA_AGENT_HEALTH_QUIET_PERIOD", show_envvar=True,
              help="Seconds a fault must stay clear before the device is healthy again.")
@click.option("--health-taint-effects", default="", envvar="DRA_AGENT_HEALTH_TAINT_EFFECTS",
              show_envvar=True,
              help="KIND=EFFECT overrides, e.g. xid=NoExecute,unmonitored=off "
                   "(kinds: xid, ecc, gpu-lost, link-down, unmonitored).")
@click.option("--device-metadata/--no-device-metadata", default=True, show_default=True,
              envvar="DRA_AGENT_DEVICE_METADATA", show_envvar=True,
              help="Give each container the metadata file of its requests' devices "
                   "(/var/run/kubernetes.io/dra-device-attributes/..., KEP-5304).")
@click.option("--mps-pipe-dir", type=click.Path(file_okay=False), default=None,
              envvar="DRA_AGENT_MPS_PIPE_DIR", show_envvar=True,
              help="Pipe directory of the node's MPS control daemon (nvidia-cuda-mps-control "
                   "-d): shares whose claim config asks for sharing.mps become its clients.")
@click.option("--node-address", "node_addresses", multiple=True,
              envvar="DRA_AGENT_NODE_ADDRESS", show_envvar=True,
              help="A node address whose NIC is never offered (repeatable).")
@click.option("--allow-device-plugin-overlap/--no-allow-device-plugin-overlap", default=False,
              show_default=True, envvar="DRA_AGENT_ALLOW_DEVICE_PLUGIN_OVERLAP",
              show_envvar=True,
              help="Start even where a device plugin advertises an extended resource that one "
                   "of our DeviceClasses maps to this node's devices (both would hand them out).")
@common_options
def command(**kwargs: Any) -> None:
    """Run the agent: discover, publish ResourceSlices, serve the kubelet."""
    # First, before any thread (gRPC's, the monitors') binds itself to a malloc arena.
    from agent.common.memory import limit_arenas

    limit_arenas()
    # No collection while the start loads about 600 modules and builds their classes: each
    # pass would walk every object made so far and free nothing (2-3% of the instructions
    # until registration). Daemon.run collects, freezes and resumes it once started.
    gc.disable()
    try:
        _run(kwargs)
    finally:
        gc.enable()


def _run(kwargs: dict[str, Any]) -> None:
    from agent.common.lazyimport import defer

    defer()  # before gRPC loads: the parts of it a sync server never uses wait for a use
    # The sockets' modules only: the daemon's (discovery, the preparer, the kube client, the
    # health monitor) load once the kubelet can register us (agent/daemon/daemon.py).
    from agent.daemon import DaemonError, RunOptions, early

    os.umask(0o077)  # what the agent creates (plugin dir, checkpoint, specs) is root's only
    cfg = pop_config(kwargs)
    health = _health_options(kwargs)
    rolling_update: bool = kwargs["rolling_update"]
    pod_uid: str | None = kwargs["pod_uid"]
    # A daemon logs its events by default; -v adds debug.
    setup_logging(cfg.log_format, cfg.verbosity + 1)
    if rolling_update and not pod_uid:
        raise click.UsageError("--rolling-update needs --pod-uid (or POD_UID)")
    options = RunOptions(
        rolling_update=rolling_update, pod_uid=pod_uid,
        shutdown_grace_s=kwargs["shutdown_grace_s"], slow_rescan_s=kwargs["slow_rescan_s"],
        node_addresses=kwargs["node_addresses"], driver_root=Path(kwargs["driver_root"]),
        host_driver_root=Path(kwargs["host_driver_root"]),
        boot_id_path=Path(kwargs["boot_id_file"]), health=health,
        device_metadata=kwargs["device_metadata"],
        allow_device_plugin_overlap=kwargs["allow_device_plugin_overlap"],
        mps_pipe_dir=Path(kwargs["mps_pipe_dir"]) if kwargs["mps_pipe_dir"] else None,
    )
    # A signal before the daemon exists (its modules load) is kept for it; a second one
    # exits at once, as later.
    stops: list[str] = []
    daemon: Daemon | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stops or (daemon is not None and daemon.stop_event.is_set()):
            os._exit(FORCED_EXIT)
        if daemon is None:
            stops.append(signal.Signals(signum).name)
        else:
            daemon.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sockets = early.serve(cfg, options)
        try:
            import agent.daemon  # its Daemon loads here, once the sockets answer

            daemon = agent.daemon.Daemon(cfg, options, sockets=sockets)
            if stops:
                daemon.request_stop(stops[0])
            code = daemon.run()
        finally:
            sockets.stop(0)  # the daemon's stop removed them already; whatever ended it
    except DaemonError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    sys.exit(code)
