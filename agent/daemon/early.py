"""The first thing ``dra-agent run`` does once its options are read: serve the kubelet's two
sockets (``agent.plugin.serving``), so that the registration answers while the rest of the
agent is still loading. This module and what it imports are the whole of that fast path:
gRPC's sync server, the registration and DRA protos, the socket helpers; nothing of the
daemon, the kube client, discovery or prometheus_client (agent/daemon/daemon.py says why
registering this early is honest).
"""

from __future__ import annotations

from agent.common.config import Config
from agent.daemon.options import DaemonError, RunOptions
from agent.plugin.serving import PluginOptions, ServedSockets
from agent.plugin.sockets import SocketError


def plugin_options(cfg: Config, run: RunOptions) -> PluginOptions:
    """The plugin's sockets and registration, from ``cfg`` and ``run``."""
    return PluginOptions(driver_name=cfg.driver_name, kubelet_dir=cfg.kubelet_dir,
                         pod_uid=run.pod_uid, rolling_update=run.rolling_update,
                         registration_timeout_s=run.registration_timeout_s)


def serve(cfg: Config, run: RunOptions) -> ServedSockets:
    """Take the instance lock and serve both sockets; calls wait until the daemon opens
    them. A socket or lock that cannot be used is a ``DaemonError``, nothing left behind."""
    try:
        sockets = ServedSockets(plugin_options(cfg, run), health=run.health is not None)
        sockets.start()
    except SocketError as err:  # AlreadyRunningError included
        raise DaemonError(str(err)) from err
    return sockets
