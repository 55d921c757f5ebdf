"""What the kubelet stand-in reports: claim references, registrations, results and errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


class KubeletError(Exception):
    """Base of everything the stand-in raises about a plugin."""


class KubeletProtocolError(KubeletError):
    """The plugin answered something a kubelet rejects."""

    def __init__(self, driver: str, method: str, reason: str, claim_uid: str = "") -> None:
        where = f" (claim {claim_uid})" if claim_uid else ""
        super().__init__(f"{driver}: {method}: {reason}{where}")
        self.driver, self.method, self.reason, self.claim_uid = driver, method, reason, claim_uid


class PluginCallError(KubeletError):
    """The whole gRPC call failed; the kubelet fails the pod's prepare and retries later."""

    def __init__(self, driver: str, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{driver}: {method}: {code.name}: {details}")
        self.driver, self.method, self.code, self.details = driver, method, code, details


class DriverNotRegisteredError(KubeletError):
    def __init__(self, driver: str) -> None:
        super().__init__(f"DRA driver {driver} is not registered")
        self.driver = driver


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Registration:
    driver: str
    endpoint: str
    service: str  # the chosen entry of supported_versions, e.g. "v1.DRAPlugin"
    socket_path: Path
    supported_versions: tuple[str, ...] = ()
    #: The DRAResourceHealth service the kubelet will open, "" if the plugin lists none.
    health_service: str = ""


@dataclass(frozen=True, slots=True)
class RegistrationFailure:
    socket_path: Path
    error: str
    notified: bool  # whether NotifyRegistrationStatus(false) was sent (dial and GetInfo worked)


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None  # v1 only; None when the field is absent


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True, slots=True)
class UnprepareResult:
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error
