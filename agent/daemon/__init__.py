"""``dra-agent run``: the daemon (``daemon``), its options (``options``), the composition
root that builds its parts (``wiring``) and the sockets served before them (``early``).

``Daemon`` loads on first use: ``agent.daemon.early`` serves the kubelet's sockets before
the daemon's modules (discovery, the preparer, the kube client) are imported.
"""

from typing import TYPE_CHECKING, Any

from agent.daemon.options import DaemonError, NoAPIClaimSource, RunOptions

if TYPE_CHECKING:
    from agent.daemon.daemon import Daemon

__all__ = ["Daemon", "DaemonError", "NoAPIClaimSource", "RunOptions"]


def __getattr__(name: str) -> Any:
    if name == "Daemon":
        from agent.daemon.daemon import Daemon

        return Daemon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
