"""Device preparation for claims: knows devices, checkpoint and CDI, nothing of gRPC."""

from agent.prepare.cdispecs import (
    CDIClaimSpecs,
    ClaimSpecs,
    CommonEdits,
    DeviceEdits,
    EnvOnlyEdits,
)
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.devices import SpecDevice
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.recovery import RecoveryReport, recover
from agent.prepare.state import DevicePreparer

__all__ = [
    "CDIClaimSpecs",
    "ClaimMetadata",
    "ClaimSpecs",
    "CommonEdits",
    "DeviceEdits",
    "DevicePreparer",
    "EnvOnlyEdits",
    "HostMetadataFiles",
    "RecoveryReport",
    "SpecDevice",
    "recover",
]
