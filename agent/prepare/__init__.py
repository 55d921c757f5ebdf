"""Device preparation for claims: knows devices, checkpoint and CDI, nothing of gRPC."""

from agent.prepare.cdispecs import CDIClaimSpecs, CommonEdits, DeviceEdits, EnvOnlyEdits
from agent.prepare.state import ClaimSpecs, DevicePreparer, RecoveryReport, SpecDevice

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
