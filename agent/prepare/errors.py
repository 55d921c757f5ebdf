"""Per-claim preparation errors; each names the claim, the device and what to do."""

from __future__ import annotations

from agent.claim.model import ClaimError


class UnknownDeviceError(ClaimError):
    reason = "unknown_device"


class DeviceTakenError(ClaimError):
    reason = "device_taken"


class BadConfigError(ClaimError):
    reason = "bad_config"


class SpecWriteError(ClaimError):
    reason = "cdi_write"


class CheckpointUnavailableError(ClaimError):
    reason = "checkpoint"


class DeviceMetadataError(ClaimError):
    reason = "device_metadata"


class NotShareableError(ClaimError):
    reason = "not_shareable"


class CapacityExceededError(ClaimError):
    reason = "capacity_exceeded"
