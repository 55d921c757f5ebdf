"""Device preparation for claims: knows devices, checkpoint and CDI, nothing of gRPC."""

from agent.prepare.cdispecs import CDIClaimSpecs, CommonEdits, DeviceEdits, EnvOnlyEdits
from agent.prepare.devices import SpecDevice
from agent.prepare.state import ClaimSpecs, DevicePreparer, RecoveryReport

__all__ = [
    "CDIClaimSpecs",
    "ClaimSpecs",
    "CommonEdits",
    "DeviceEdits",
    "DevicePreparer",
    "EnvOnlyEdits",
    "RecoveryReport",
    "SpecDevice",
]
