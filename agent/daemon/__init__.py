"""``dra-agent run``: the daemon (``daemon``), its options (``options``) and the composition
root that builds its parts (``wiring``)."""

from agent.daemon.daemon import Daemon
from agent.daemon.options import DaemonError, NoAPIClaimSource, RunOptions

__all__ = ["Daemon", "DaemonError", "NoAPIClaimSource", "RunOptions"]
