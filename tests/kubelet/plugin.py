"""A tiny DRA plugin for testing the kubelet stand-in: real gRPC servers on unix sockets.

Its answers are scripted per test, so the stand-in can be shown both good and bad answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from protos.dra.v1 import api_pb2 as v1
from protos.dra.v1 import api_pb2_grpc as v1_grpc
from protos.dra.v1beta1 import api_pb2 as v1beta1
from protos.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from protos.pluginregistration import api_pb2 as reg
from protos.pluginregistration import api_pb2_grpc as reg_grpc

# (api module, request, grpc context) -> response message of that api module
Answer = Callable[[Any, Any, grpc.ServicerContext], Any]


def good_prepare(api: Any, request: Any, context: grpc.ServicerContext) -> Any:
    """One device per claim with a request name and a CDI ID, as our driver answers."""
    out = api.NodePrepareResourcesResponse()
    for claim in request.claims:
        out.claims[claim.uid].devices.add(
            request_names=["gpu"],
            pool_name="node-a",
            device_name="gpu-0",
            cdi_device_ids=[f"k8s.gpu.example.com/gpu={claim.uid}-gpu-0"],
        )
    return out


def good_unprepare(api: Any, request: Any, context: grpc.ServicerContext) -> Any:
    out = api.NodeUnprepareResourcesResponse()
    for claim in request.claims:
        out.claims[claim.uid]  # an empty entry is a success
    return out


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        p = self.plugin
        return reg.PluginInfo(
            type=p.plugin_type,
            name=p.driver,
            endpoint=p.advertised_endpoint,
            supported_versions=list(p.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.plugin.cond:  # the flag is read with the append: a test flips it under cond
            self.plugin.statuses.append((request.plugin_registered, request.error))
            refused = self.plugin.refuse_notices
            if not refused:
                self.plugin.notices_accepted += 1
            self.plugin.cond.notify_all()
        if refused:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not listening to the kubelet")
        if not request.plugin_registered and not self.plugin.accept_failure_notices:
            # As the Go helper does: a refused registration is answered with an error status.
            context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {request.error}")
        return reg.RegistrationStatusResponse()


class _DRA:
    """Servicer body shared by v1 and v1beta1: records the call, answers as scripted."""

    def __init__(self, plugin: FakePlugin, version: str, api: Any) -> None:
        self.plugin, self.version, self.api = plugin, version, api

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.plugin.record(self.version, "NodePrepareResources", request, context)
        return self.plugin.prepare_answer(self.api, request, context)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.plugin.record(self.version, "NodeUnprepareResources", request, context)
        return self.plugin.unprepare_answer(self.api, request, context)


class _V1(_DRA, v1_grpc.DRAPluginServicer):
    pass


class _V1beta1(_DRA, v1beta1_grpc.DRAPluginServicer):
    pass


class _Health(health_grpc.DRAResourceHealthServicer):
    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        yield from self.plugin.health_updates
        # Stay open, as a driver does, until the kubelet cancels.
        while context.is_active():
            self.plugin.health_done.wait(0.05)


class FakePlugin:
    """A DRA plugin with a registration socket and a DRA socket (or one socket for both)."""

    def __init__(
        self,
        root: Path,
        driver: str = "gpu.example.com",
        *,
        plugin_type: str = "DRAPlugin",
        versions: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        endpoint: str | None = None,
        reg_name: str | None = None,
        single_socket: bool = False,
    ) -> None:
        self.driver = driver
        self.plugin_type = plugin_type
        self.versions = tuple(versions)
        self.registry = root / "plugins_registry"
        self.reg_socket = self.registry / (reg_name or f"{driver}-reg.sock")
        self.dra_socket = root / "plugins" / driver / "dra.sock"
        self.single_socket = single_socket
        default = "" if single_socket else str(self.dra_socket)
        self.advertised_endpoint = default if endpoint is None else endpoint
        self.prepare_answer: Answer = good_prepare
        self.unprepare_answer: Answer = good_unprepare
        self.health_updates: list[Any] = []
        self.health_done = threading.Event()
        self.cond = threading.Condition()
        self.statuses: list[tuple[bool, str]] = []
        #: Answer every NotifyRegistrationStatus with an error (a failed notify(true) too).
        self.refuse_notices = False
        #: Notices answered while ``refuse_notices`` was off.
        self.notices_accepted = 0
        #: Answer a failed registration's notice with OK, as our agent does (the Go helper
        #: answers it with an error).
        self.accept_failure_notices = False
        self.calls: list[tuple[str, str, Any, float | None]] = []
        self._reg_server: grpc.Server | None = None
        self._dra_server: grpc.Server | None = None

    def record(self, version: str, method: str, request: Any, ctx: grpc.ServicerContext) -> None:
        with self.cond:
            self.calls.append((version, method, request, ctx.time_remaining()))

    def _server(self, path: Path, *, registration: bool, dra: bool) -> grpc.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if registration:
            reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if dra:
            v1_grpc.add_DRAPluginServicer_to_server(_V1(self, "v1", v1), server)
            v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(self, "v1beta1", v1beta1), server)
            health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        return server

    def start(self) -> FakePlugin:
        if self.single_socket:
            self._reg_server = self._server(self.reg_socket, registration=True, dra=True)
            return self
        # DRA socket first, so the endpoint exists when the kubelet validates it.
        self._dra_server = self._server(self.dra_socket, registration=False, dra=True)
        self.start_registration()
        return self

    def start_registration(self) -> None:
        self._reg_server = self._server(self.reg_socket, registration=True, dra=False)

    def stop_registration(self) -> None:
        if self._reg_server is not None:
            self._reg_server.stop(None).wait()  # a clean stop removes the socket file
            self._reg_server = None

    def stop(self) -> None:
        self.health_done.set()
        self.stop_registration()
        if self._dra_server is not None:
            self._dra_server.stop(None).wait()
            self._dra_server = None

    def wait_status(self, count: int = 1, timeout: float = 5) -> list[tuple[bool, str]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.statuses) >= count, timeout), self.statuses
            return list(self.statuses)
