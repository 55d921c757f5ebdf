"""The kubelet plugin: registration, the DRA gRPC services, prepare/unprepare, checkpoint.

The daemon builds one ``PluginServer`` and calls ``start()`` and ``stop()``::

    server = PluginServer(options, api_client, inventory_provider, edits, metrics)
    server.start()          # recovers the checkpoint, serves dra.sock, then registers
    ...
    server.stop(grace_s=5)  # stops serving and removes both sockets

Order matters: the DRA socket serves before the registration socket exists, so the kubelet
never registers an endpoint that does not answer yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.checkpoint.store import CheckpointStore, read_boot_id
from agent.common.failpoints import Failpoints
from agent.common.metrics import Metrics
from agent.plugin.framework import APIClaimSource, ClaimSource, PluginFramework
from agent.plugin.limits import MAX_STREAMS, StreamSlots, max_concurrent_rpcs, server_options
from agent.plugin.registration import DRA_SERVICES, HEALTH_SERVICES, RegistrationServer
from agent.plugin.server import add_dra_services
from agent.plugin.sockets import (
    AlreadyRunningError,
    InstanceLock,
    SocketError,
    SocketPaths,
    bind_unix,
    remove_socket,
    socket_paths,
)
from agent.prepare.cdispecs import CDIClaimSpecs, DeviceEdits
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.enforce import GpuControl
from agent.prepare.metadata import HOST_SUBDIR
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.recovery import recover
from agent.prepare.state import DevicePreparer
from discovery.model import Inventory

if TYPE_CHECKING:
    from agent.prepare.partitions import MigPartitions
    from agent.prepare.vfs import VfProvisioner

__all__ = [
    "AlreadyRunningError",
    "PluginOptions",
    "PluginServer",
    "SocketError",
]

log = logging.getLogger(__name__)
#: Seconds an instance that has deregistered keeps serving while a successor is registered:
#: the kubelet's plugin watcher reconciles every second, then it calls the successor only.
HANDOVER_DRAIN_S = 2.0


@dataclass(frozen=True, slots=True)
class PluginOptions:
    driver_name: str
    node_name: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    pod_uid: str | None = None
    rolling_update: bool = False
    registration_timeout_s: float = 30.0
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    #: Pool of this node's devices; the DESIGN names it after the node.
    pool_name: str | None = None
    #: Threads for prepare/unprepare calls; health streams get their own on top
    #: (``agent.plugin.limits``).
    max_workers: int = 16
    #: Write a device metadata file per request and mount it into the containers
    #: (``agent.prepare.metadata``). On by default, where the upstream helper's
    #: ``EnableDeviceMetadata`` option is off unless a driver enables it: the file holds only
    #: what the ResourceSlice publishes, and 1.35's runtimes apply the mount like any other.
    device_metadata: bool = True
    #: The node's MPS control daemon's pipe directory, for shares asking for MPS
    #: (``agent.prepare.enforce``); None: no daemon the agent knows of.
    mps_pipe_dir: Path | None = None

    @property
    def pool(self) -> str:
        return self.pool_name or self.node_name


class PluginServer:
    def __init__(  # noqa: PLR0917 (the daemon's call shape is fixed)
        self,
        options: PluginOptions,
        api_client: Any,
        inventory_provider: Callable[[], Inventory],
        edits: DeviceEdits,
        metrics: Metrics | None = None,
        health_servicer: Any = None,
        *,
        claim_source: ClaimSource | None = None,
        failpoints: Failpoints | None = None,
        gpu_control: GpuControl | None = None,
        partitions: MigPartitions | None = None,
        vfs: VfProvisioner | None = None,
    ) -> None:
        if api_client is None and claim_source is None:
            # Without an API server there is no claim to read: fail at start, not per call.
            raise ValueError("the kubelet plugin needs an API client to read claims")
        self.options = options
        self.metrics = metrics or Metrics()
        self.paths: SocketPaths = socket_paths(
            options.kubelet_dir, options.driver_name, options.pod_uid, options.rolling_update
        )
        self.checkpoint = CheckpointStore(self.paths.plugin_dir / "checkpoint.json", self.metrics)
        self.specs = CDIClaimSpecs(options.cdi_dir, options.driver_name, edits)
        # Always given the files, also when switched off: unprepare removes what a run with
        # the feature on wrote.
        metadata = ClaimMetadata(
            options.driver_name, HostMetadataFiles(self.paths.plugin_dir / HOST_SUBDIR),
            enabled=options.device_metadata,
        )
        self.preparer = DevicePreparer(
            driver=options.driver_name, pool=options.pool, node_name=options.node_name,
            checkpoint=self.checkpoint, specs=self.specs, inventory=inventory_provider,
            boot_id=read_boot_id(options.boot_id_path), metrics=self.metrics,
            metadata=metadata, gpu_control=gpu_control, mps_pipe_dir=options.mps_pipe_dir,
            partitions=partitions, vfs=vfs,
        )
        self.framework = PluginFramework(
            options.driver_name,
            claim_source or APIClaimSource(api_client),
            self.preparer,
            self.metrics,
            serialize_lock=self.paths.serialize_lock if options.rolling_update else None,
            failpoints=failpoints,
        )
        #: Served on the DRA socket in every version of agent.health.HEALTH_SERVICES.
        self.health_servicer = health_servicer
        versions = DRA_SERVICES if health_servicer is None else (*DRA_SERVICES, *HEALTH_SERVICES)
        self.registration = RegistrationServer(
            self.paths.registration, options.driver_name, self.paths.dra, versions,
            timeout_s=options.registration_timeout_s,
        )
        self._lock = InstanceLock(self.paths.instance_lock)
        self._dra: Any = None
        #: Open response streams (the kubelet's health stream), at most MAX_STREAMS.
        self.streams = StreamSlots(MAX_STREAMS)

    @property
    def registered(self) -> bool:
        return self.registration.registered

    @property
    def serving(self) -> bool:
        return self._dra is not None

    def start(self) -> None:
        """Take the instance lock, recover, serve, register; raises on any failure."""
        self._lock.acquire()
        try:
            self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
            with self.framework.exclusive():
                recover(self.preparer)
            self._serve_dra()
            self.registration.start()
        except BaseException:
            self.stop(0)
            raise
        log.info(
            "kubelet plugin serving",
            extra={"endpoint": str(self.paths.dra), "registration": str(self.paths.registration)},
        )

    def _serve_dra(self) -> None:
        import grpc

        # Streams hold their thread while open: they get MAX_STREAMS threads of their own
        # (StreamSlots refuses more), so max_workers always remain for prepare/unprepare.
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.options.max_workers + MAX_STREAMS, thread_name_prefix="dra"
            ),
            interceptors=[self.streams],
            options=server_options(),
            maximum_concurrent_rpcs=max_concurrent_rpcs(self.options.max_workers),
        )
        add_dra_services(server, self.framework, self.metrics)
        if self.health_servicer is not None:
            from agent.health.stream import add_health_services

            # Both versions, under the same StreamSlots interceptor as everything else.
            add_health_services(self.health_servicer, server)
        bind_unix(server, self.paths.dra)
        server.start()
        self._dra = server

    def _handover_drain_s(self, grace_s: float) -> float:
        """How long to keep serving after deregistering: ``HANDOVER_DRAIN_S`` (within the
        grace period) while another instance of this driver is registered beside this one (a
        rolling update's successor), else nothing."""
        registry = self.paths.registration.parent
        driver = self.options.driver_name
        def sibling(path: Path) -> bool:  # another instance's registration socket
            name = path.name
            return path != self.paths.registration and (
                name == f"{driver}-reg.sock"
                or (name.startswith(f"{driver}-") and name.endswith("-reg.sock")))
        try:
            others = [p for p in registry.iterdir() if sibling(p)]
        except OSError:
            return 0.0
        return min(HANDOVER_DRAIN_S, grace_s) if others else 0.0

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop registration first (the kubelet stops sending), then the DRA service.

        A no-op unless this instance holds the instance lock: the sockets at these paths
        would otherwise belong to the agent that does.
        """
        if not self._lock.held:
            return
        self.registration.stop(min(grace_s, 1.0))
        drain = self._handover_drain_s(grace_s)
        if drain > 0 and self._dra is not None:
            # The kubelet holds this instance until its plugin watcher sees the registration
            # socket gone (its next reconcile, 1 s) and calls the newest *connected* instance
            # of the driver: right after a kubelet restart the successor may not be connected
            # yet, and a call refused here failed a Pod's prepare on a real node
            # (tests/cluster: FailedPrepareDynamicResources during a rolling update).
            log.info("handing over to a newer instance: still serving",
                     extra={"driver": self.options.driver_name, "seconds": drain})
            time.sleep(drain)
        if self._dra is not None:
            self._dra.stop(grace_s).wait()
            self._dra = None
        remove_socket(self.paths.dra)
        self.checkpoint.close()
        self._lock.release()
