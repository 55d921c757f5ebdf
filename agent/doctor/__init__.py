"""``dra-agent doctor``: why pods on this node would not get their devices.

One module per area (runtime, kubelet, api, conflicts, hardware, agent); each check is a small
function of a ``Context`` returning one ``Check``. ``runner`` runs them (a check that raises is
one warning, never a crash), ``render`` prints them, ``simulate`` builds a healthy host root.
"""

from agent.doctor.model import Check, Status

__all__ = ["Check", "Status"]
