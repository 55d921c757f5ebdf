"""Device preparation for claims: knows devices, checkpoint and CDI, nothing of gRPC."""

from agent.prepare.cdispecs import (
    CDIClaimSpecs,
    ClaimSpecs,
    CommonEdits,
    DeviceEdits,
    EnvOnlyEdits,
)
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.claimspec import ClaimBuilder
from agent.prepare.devices import SpecDevice
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.preparer import DevicePreparer
from agent.prepare.recovery import RecoveryReport, recover

__all__ = [
    "CDIClaimSpecs",
    "ClaimBuilder",
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
