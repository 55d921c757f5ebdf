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


class AdminAccessError(BadConfigError):
    """A claim with admin access asks for a change on the host: admin access is for
    monitoring a device another claim may hold, so it never rebinds, resets, caps, moves,
    creates or destroys anything (``admin_refusal``)."""

    reason = "admin_access"


def admin_refusal(claim: str, device: str, request: str, what: str) -> AdminAccessError:
    """The one line refusing ``what`` (a config key, or the change it implies) on a device
    allocated with admin access."""
    return AdminAccessError(
        claim, f"request {request}: device {device} is allocated with admin access, which is "
               f"for monitoring a device another claim may hold and changes nothing on the "
               f"host; {what}")
