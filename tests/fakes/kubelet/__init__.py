"""A kubelet stand-in: the client side of the DRA plugin protocols, as a 1.34+ kubelet drives it.

No real kubelet runs on our machines, so this package plays its part over real unix sockets:
:class:`KubeletStandIn` watches a plugins_registry directory, registers the DRA plugins whose
sockets appear there (GetInfo with a 1 s deadline, type ``DRAPlugin``, the first known entry of
``supported_versions``, NotifyRegistrationStatus), calls NodePrepareResources and
NodeUnprepareResources with a 45 s deadline and rejects the answers a kubelet rejects, opens the
device health stream, and wipes the node's ResourceSlices as a restarting kubelet does.

    with KubeletStandIn(registry_dir) as kubelet:
        reg = kubelet.wait_registered("dra-agent.io")
        results = kubelet.prepare("dra-agent.io", [ClaimRef("ns", "claim", uid)])

:class:`PodClaims` adds the kubelet's DRA manager per pod on top (claim GET, reservedFor,
owner and registration checks before any call; the whole pod fails on one claim's error).
README.md lists what the real kubelet does and which parts the stand-in plays.
"""

from tests.fakes.kubelet.pods import ClaimGetter, PodClaims, PodError
from tests.fakes.kubelet.registry import HEALTH_SERVICES_135, HEALTH_SERVICES_137, PluginWatcher
from tests.fakes.kubelet.standin import CALL_TIMEOUT, SERVICES, HealthStream, KubeletStandIn
from tests.fakes.kubelet.types import (
    ClaimRef,
    DriverNotRegisteredError,
    KubeletError,
    KubeletProtocolError,
    PluginCallError,
    PreparedDevice,
    PrepareResult,
    Registration,
    RegistrationFailure,
    UnprepareResult,
)

__all__ = [
    "CALL_TIMEOUT",
    "HEALTH_SERVICES_135",
    "HEALTH_SERVICES_137",
    "SERVICES",
    "ClaimGetter",
    "ClaimRef",
    "DriverNotRegisteredError",
    "HealthStream",
    "KubeletError",
    "KubeletProtocolError",
    "KubeletStandIn",
    "PluginCallError",
    "PluginWatcher",
    "PodClaims",
    "PodError",
    "PrepareResult",
    "PreparedDevice",
    "Registration",
    "RegistrationFailure",
    "UnprepareResult",
]
