"""The kubelet's DRA manager side: prepare, unprepare, health stream and slice wiping."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from protos.drahealth.v1 import api_pb2 as health_v1
from protos.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from protos.drahealth.v1alpha1 import api_pb2 as health
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from tests.fakes.kubelet.registry import (
    DIAL_TIMEOUT,
    RETRY_INITIAL,
    PluginWatcher,
)
from tests.fakes.kubelet.types import (
    ClaimRef,
    DriverNotRegisteredError,
    KubeletProtocolError,
    PluginCallError,
    PreparedDevice,
    PrepareResult,
    Registration,
    UnprepareResult,
)

log = logging.getLogger(__name__)

CALL_TIMEOUT = 45.0  # kubelet DRA manager: defaultClientCallTimeout

# entry of supported_versions -> (message module, stub class)
SERVICES: Mapping[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (v1, v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc.DRAPluginStub),
}
# The health services the stand-in can open -> (message module, stub class)
HEALTH: Mapping[str, tuple[ModuleType, Any]] = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (health, health_grpc.DRAResourceHealthStub),
}
#: What a plugin that lists no health service gets: 1.35 opens v1alpha1 whatever the plugin
#: lists (1.37 would open nothing; tests of that read ``Registration.health_service``).
UNADVERTISED_HEALTH = "v1alpha1.DRAResourceHealth"

_CDI_ID = re.compile(
    r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"  # vendor
    r"/[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?"  # class
    r"=[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?"  # device name
)


class HealthStream(Protocol):
    """The server-streaming call: responses as they come; ``cancel()`` ends the stream."""

    def __iter__(self) -> Iterator[health.NodeWatchResourcesResponse]: ...
    def __next__(self) -> health.NodeWatchResourcesResponse: ...
    def cancel(self) -> bool: ...


class KubeletStandIn(PluginWatcher):
    """Registers DRA plugins found in ``registry_dir`` and calls them as a 1.34+ kubelet does.

    ``strict_devices`` (default on) also rejects prepared devices without request names or CDI
    IDs. A real kubelet accepts both (empty request names mean "all requests"), but our driver
    always sends them, so their absence is a bug worth failing on. ``minor`` and
    ``strict_registration``: see :class:`PluginWatcher`.
    """

    def __init__(
        self,
        registry_dir: Path,
        *,
        minor: str = "1.37",
        known_services: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        known_health_services: Sequence[str] | None = None,
        api_client: Any | None = None,
        node_name: str | None = None,
        poll_interval: float = 0.05,
        retry_initial: float = RETRY_INITIAL,
        dial_timeout: float = DIAL_TIMEOUT,
        strict_devices: bool = True,
        strict_registration: bool = True,
    ) -> None:
        unknown = [s for s in known_services if s not in SERVICES]
        if unknown:
            raise ValueError(f"the stand-in cannot speak {unknown}; it knows {list(SERVICES)}")
        unknown = [s for s in known_health_services or () if s not in HEALTH]
        if unknown:
            raise ValueError(f"the stand-in cannot open {unknown}; it knows {list(HEALTH)}")
        super().__init__(
            registry_dir,
            minor=minor,
            known_services=known_services,
            known_health_services=known_health_services,
            poll_interval=poll_interval,
            retry_initial=retry_initial,
            dial_timeout=dial_timeout,
            strict_registration=strict_registration,
        )
        self.api_client = api_client
        self.node_name = node_name
        self.strict_devices = strict_devices

    # --- NodePrepareResources / NodeUnprepareResources ------------------------------------

    def prepare(
        self, driver: str, claims: Sequence[ClaimRef], timeout: float = CALL_TIMEOUT
    ) -> dict[str, PrepareResult]:
        """One NodePrepareResources call; results keyed by claim UID in request order.

        Per-claim errors come back as results with ``error`` set; answers the kubelet rejects
        raise :class:`KubeletProtocolError`; a failed call raises :class:`PluginCallError`.
        """
        method = "NodePrepareResources"
        _check_request(claims)
        registration, api, stub = self._stub(driver)
        request = api.NodePrepareResourcesRequest(claims=[_claim(api, c) for c in claims])
        answer = _call(driver, method, lambda: stub.NodePrepareResources(request, timeout=timeout))
        out: dict[str, PrepareResult] = {}
        for uid, res in _check_uids(driver, method, claims, answer.claims).items():
            if res.error:
                out[uid] = PrepareResult(error=res.error)
            else:
                devices = tuple(self._device(registration, uid, d) for d in res.devices)
                out[uid] = PrepareResult(devices=devices)
        return out

    def unprepare(
        self, driver: str, claims: Sequence[ClaimRef], timeout: float = CALL_TIMEOUT
    ) -> dict[str, UnprepareResult]:
        """One NodeUnprepareResources call; every requested claim must have an entry."""
        method = "NodeUnprepareResources"
        _check_request(claims)
        _, api, stub = self._stub(driver)
        request = api.NodeUnprepareResourcesRequest(claims=[_claim(api, c) for c in claims])
        answer = _call(
            driver, method, lambda: stub.NodeUnprepareResources(request, timeout=timeout)
        )
        results = _check_uids(driver, method, claims, answer.claims)
        return {uid: UnprepareResult(error=res.error) for uid, res in results.items()}

    # --- health ---------------------------------------------------------------------------

    def health_stream(self, driver: str, timeout: float | None = None) -> HealthStream:
        """Open NodeWatchResources on the driver's endpoint, in the version chosen at
        registration (``Registration.health_service``; see ``UNADVERTISED_HEALTH``).

        The result is the grpc call itself: iterate it for responses; ``cancel()`` closes the
        stream as the kubelet does when the plugin deregisters. Errors surface as
        ``grpc.RpcError`` while iterating (the kubelet reopens the stream after 5 s).
        """
        registration, channel = self._connection(driver)
        api, stub_class = HEALTH[registration.health_service or UNADVERTISED_HEALTH]
        stream: HealthStream = stub_class(channel).NodeWatchResources(
            api.NodeWatchResourcesRequest(), timeout=timeout
        )
        return stream

    # --- ResourceSlice wiping -------------------------------------------------------------

    def wipe_slices(self, driver: str | None = None, *, api_version: str = "v1") -> int:
        """Delete this node's ResourceSlices: all drivers (kubelet start) or one driver.

        One DELETE of the collection with a ``spec.nodeName`` field selector, the only form the
        node authorizer allows a kubelet. Returns how many slices the server says it deleted.
        """
        if self.api_client is None or not self.node_name:
            raise RuntimeError("wipe_slices needs an api_client and a node_name")
        from kubernetes.client.exceptions import ApiException

        selector = f"spec.nodeName={self.node_name}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        client = self.api_client
        method, url, headers, body, _ = client.param_serialize(
            method="DELETE",
            resource_path=f"/apis/resource.k8s.io/{api_version}/resourceslices",
            query_params=[("fieldSelector", selector)],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = client.call_api(method, url, header_params=headers, body=body)
        text = response.read().decode()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        items = (json.loads(text).get("items") or []) if text else []
        log.info("node slices wiped", extra={"node": self.node_name, "deleted": len(items)})
        return len(items)

    # --- internals ------------------------------------------------------------------------

    def _connection(self, driver: str) -> tuple[Registration, grpc.Channel]:
        found = self.connection(driver)
        if found is None:
            raise DriverNotRegisteredError(driver)
        return found

    def _stub(self, driver: str) -> tuple[Registration, ModuleType, Any]:
        registration, channel = self._connection(driver)
        api, stub_class = SERVICES[registration.service]
        return registration, api, stub_class(channel)

    def _device(self, registration: Registration, uid: str, d: Any) -> PreparedDevice:
        driver, method = registration.driver, "NodePrepareResources"

        def reject(reason: str) -> KubeletProtocolError:
            return KubeletProtocolError(driver, method, reason, uid)

        if not d.pool_name or not d.device_name:
            raise reject(f"device without pool or device name: {d}")
        if self.strict_devices and not d.request_names:
            raise reject(f"device {d.device_name} has no request names")
        if self.strict_devices and not d.cdi_device_ids:
            raise reject(f"device {d.device_name} has no CDI device IDs")
        for cdi_id in d.cdi_device_ids:
            if not _CDI_ID.fullmatch(cdi_id):
                raise reject(f"device {d.device_name}: malformed CDI device ID {cdi_id!r}")
        # share_id exists in v1 only and has explicit presence.
        has_share = registration.service == "v1.DRAPlugin" and d.HasField("share_id")
        return PreparedDevice(
            request_names=tuple(d.request_names),
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=tuple(d.cdi_device_ids),
            share_id=d.share_id if has_share else None,
        )


def _claim(api: ModuleType, ref: ClaimRef) -> Any:
    return api.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)


def _call(driver: str, method: str, invoke: Callable[[], Any]) -> Any:
    try:
        return invoke()
    except grpc.RpcError as err:
        code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = (err.details() if isinstance(err, grpc.Call) else None) or str(err)
        raise PluginCallError(driver, method, code, details) from err


def _check_request(claims: Sequence[ClaimRef]) -> None:
    # The kubelet batches distinct claims of one pod; a duplicate is a bug in the test.
    uids = [c.uid for c in claims]
    if len(set(uids)) != len(uids):
        raise ValueError(f"duplicate claim UIDs in one request: {uids}")


def _check_uids(
    driver: str, method: str, claims: Sequence[ClaimRef], answer: Mapping[str, Any]
) -> dict[str, Any]:
    """The kubelet's checks on both answers: no unknown claim UID, none skipped."""
    requested = [c.uid for c in claims]
    for uid in answer:
        if uid not in requested:
            raise KubeletProtocolError(driver, method, "returned result for unknown claim UID", uid)
    missing = [uid for uid in requested if uid not in answer]
    if missing:
        raise KubeletProtocolError(
            driver, method, f"skipped {len(missing)} ResourceClaims", ",".join(missing)
        )
    return {uid: answer[uid] for uid in requested}
