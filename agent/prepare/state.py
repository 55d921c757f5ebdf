"""Device preparation: what prepare and unprepare do on this node, without any gRPC.

``DevicePreparer`` receives claims already fetched and checked by the plugin framework and
answers with the devices to hand to the kubelet. It owns three facts:

* which devices exist (the inventory, asked on each call: hotplug may change it);
* which devices are prepared for which claim (the checkpoint, read-modify-written under its
  lock, so "is this device free?" and "it is mine now" happen atomically across claims);
* the CDI spec of each claim (``ClaimSpecs``), and its device metadata files
  (``ClaimMetadata``), which follow the spec through every step.

The framework serialises calls per claim; calls for different claims run in parallel here.
Start-up recovery, which builds on the same steps, is ``agent.prepare.recovery``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice, holders
from agent.checkpoint.store import CheckpointStore, CheckpointWriteError
from agent.claim.model import (
    AllocatedDevice,
    Claim,
    ClaimError,
    ClaimRef,
    allocation_json,
    check_uid,
    parse_devices,
    uid_problem,
)
from agent.claim.opaque import ConfigDecodeError, merge_configs
from agent.claim.status import NicStatus
from agent.common.failpoints import Failpoints, Point, hit
from agent.common.metrics import ClaimDevice, Metrics
from agent.prepare.cdispecs import ClaimSpecs
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.devices import (
    NETDEV_TYPES,
    SpecDevice,
    check_pod_interfaces,
    device_env,
    identified,
    nic_status,
    spec_device,
)
from agent.prepare.enforce import (
    GpuControl,
    apply_time_slices,
    check_config,
    check_time_slices,
    mps_edits,
    release_time_slices,
)
from agent.prepare.errors import (
    BadConfigError,
    CheckpointUnavailableError,
    DeviceTakenError,
    SpecWriteError,
    UnknownDeviceError,
)
from agent.prepare.shares import check_shares
from cdi.errors import CDIError
from discovery.model import Device, Inventory

if TYPE_CHECKING:
    from agent.prepare.partitions import MigPartitions
    from agent.prepare.vfs import VfProvisioner

log = logging.getLogger(__name__)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def put_record(record: ClaimRecord) -> Callable[[dict[str, ClaimRecord]], None]:
    """A checkpoint change that stores ``record`` (bound now, not when the loop moves on)."""
    return lambda claims: claims.__setitem__(record.uid, record)


class DevicePreparer:
    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        node_name: str,
        checkpoint: CheckpointStore,
        specs: ClaimSpecs,
        inventory: Callable[[], Inventory],
        boot_id: str,
        metrics: Metrics | None = None,
        failpoints: Failpoints | None = None,
        metadata: ClaimMetadata | None = None,
        gpu_control: GpuControl | None = None,
        mps_pipe_dir: Path | None = None,
        partitions: MigPartitions | None = None,
        vfs: VfProvisioner | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.node_name = node_name
        self.checkpoint = checkpoint
        self.specs = specs
        self.inventory = inventory
        self.boot_id = boot_id
        self.metrics = metrics or Metrics()
        #: Crash-test hooks (``agent.common.failpoints``); None in normal operation.
        self.failpoints = failpoints
        self.metadata = metadata or ClaimMetadata(driver, None, enabled=False)
        #: Where shares of GPUs are bounded (``agent.prepare.enforce``): nvidia-smi, or a
        #: recording stand-in on a simulated node; None where there is no such tool.
        self.gpu_control = gpu_control
        self.mps_pipe_dir = mps_pipe_dir
        #: Dynamic MIG (``--mig dynamic``): creates the partitions claims are allocated.
        self.partitions = partitions
        #: VFs on demand (``--vfs dynamic``): makes a PF's VFs when a claim first needs one.
        self.vfs = vfs

    # -- prepare --------------------------------------------------------------------------

    def prepare(self, claim: Claim) -> ClaimRecord:
        """Prepare ``claim`` (allocated, UID checked) and return its completed record."""
        ref = claim.ref
        check_uid(ref)  # the framework checked already; this keeps a bad UID off the disk
        results = claim.results_for(self.driver)
        existing = self.checkpoint.claims().get(ref.uid)
        if existing is not None and existing.completed and not existing.recovered:
            return self._repeat(claim, existing, results)
        inventory = self.inventory().by_name()
        spec_devices = [self.spec_device(claim, r, inventory) for r in results]
        check_pod_interfaces(ref, spec_devices)
        spec_devices = mps_edits(ref, spec_devices, self.mps_pipe_dir)
        files, spec_devices, metadata = self.metadata.plan(claim, results, spec_devices)
        prepared = identified([replace(self._prepared(ref, r), time_slice=d.sharing.time_slice)
                               for r, d in zip(results, spec_devices, strict=True)],
                              self.pool, inventory)
        spec_path = str(self.specs.path(ref.uid))
        cdi_ids = [i for d in prepared for i in d.cdi_ids]
        record = ClaimRecord(
            uid=ref.uid, namespace=ref.namespace, name=ref.name,
            state=ClaimState.PREPARE_STARTED, devices=prepared,
            cdi_annotations=self.specs.annotations(ref.uid, cdi_ids) if cdi_ids else {},
            spec_path=spec_path, boot_id=self.boot_id, updated=now(),
            allocation=allocation_json(claim, self.driver), metadata=metadata,
        )

        def start(claims: dict[str, ClaimRecord]) -> None:
            self._check_free(ref, results, claims)
            check_shares(ref, results, prepared, claims, inventory=inventory, pool=self.pool)
            check_time_slices(ref, prepared, claims)
            if metadata is not None:
                self.metadata.check_unshared(ref, claims)
            claims[ref.uid] = record

        # The PrepareStarted record reserves the devices at once (atomically with the check
        # above) but is not fsynced on its own: until PrepareCompleted is durable, the only
        # thing on disk is the claim's CDI spec, named by its UID, and start-up removes a spec
        # that no completed record explains. That is the same roll-back, one durable write
        # cheaper. A preparation with host side effects beyond the spec must make it durable,
        # or be found the same way: start-up removes metadata files no record lists too.
        self.store(ref, start, durable=False)
        try:
            hit(self.failpoints, Point.PREPARE_AFTER_STARTED, ref.uid)
            if self.partitions is not None:  # durable intent first, then the instances
                record, spec_devices = self.partitions.prepare(
                    ref, record, spec_devices,
                    lambda r, durable: self.store(ref, put_record(r), durable=durable))
            if self.vfs is not None:
                record, spec_devices = self.vfs.prepare(
                    ref, record, spec_devices, lambda r: self.store(ref, put_record(r)))
                made = {d.device.name: d.device for d in spec_devices}
                record = replace(record, devices=identified(record.devices, self.pool, made))
            self.metadata.write(ref, files)  # first: the spec's mounts name these files
            if any(d.sharing.time_slice for d in spec_devices):
                # On disk before the GPU changes: the PrepareStarted record names each
                # interval, for the rollback or start-up after a kill -9 to reset.
                self.store(ref, put_record(record))
            if apply_time_slices(ref, spec_devices, self.gpu_control):
                hit(self.failpoints, Point.TIME_SLICE_AFTER_SET, ref.uid)
            if spec_devices:
                self.write_spec(ref, spec_devices)
            hit(self.failpoints, Point.PREPARE_AFTER_SPEC_WRITTEN, ref.uid)
            done = record.with_state(ClaimState.PREPARE_COMPLETED, now())
            self.store(ref, lambda claims: claims.__setitem__(ref.uid, done))
            hit(self.failpoints, Point.PREPARE_AFTER_COMPLETED, ref.uid)
        except BaseException:
            if self._host_released(ref):
                self._rollback(record)
            raise
        self.update_gauges()
        return done

    def _host_released(self, ref: ClaimRef) -> bool:
        """Undo what a failed prepare changed on the host, as its record names it (the
        rollback drops that record, whatever its state); False (the record stays, for
        start-up to finish) when that fails."""
        record = self.checkpoint.claims().get(ref.uid)
        if record is None:
            return True
        try:
            self.undo_host(str(ref), record)
        except ClaimError as err:
            log.error("rollback cannot undo what the failed prepare changed on the host; "
                      "start-up retries", extra={"claim": ref.uid, "error": str(err)})
            return False
        return True

    def undo_host(self, claim: str, record: ClaimRecord, *, partitions: bool = True,
                  remaining: Mapping[str, ClaimRecord] | None = None) -> None:
        """Give back what a prepare that never completed changed beyond its files: the MIG
        partitions it made, the drivers of the VFs it rebound, the GPU intervals it set
        (unless ``remaining``, the other claims' records, still ask for one). ClaimError
        when a partition or a VF refuses."""
        if partitions and self.partitions is not None:
            self.partitions.release(claim, record)
        if self.vfs is not None:
            self.vfs.release(claim, record, restore_only=True)
        if any(d.time_slice for d in record.devices):
            release_time_slices(
                record, self.checkpoint.claims() if remaining is None else remaining,
                self.inventory().by_name(), self.gpu_control)

    def prepare_recorded(self, ref: ClaimRef) -> ClaimRecord | None:
        """Answer a repeated prepare from the checkpoint alone; None when the claim is needed.

        The kubelet repeats prepares (its restart, a container restart) and an API server
        outage must not fail them. A completed record is keyed by the claim UID, which the API
        server never reuses, so it answers for exactly that object: a claim deleted and
        re-created under the same name has a new UID and takes the full path (GET, UID check).
        A record that was recovered, names another claim, or must rewrite its spec without the
        allocation it was prepared from, takes the full path too.
        """
        check_uid(ref)
        existing = self.checkpoint.claims().get(ref.uid)
        if existing is None or not existing.completed or existing.recovered:
            return None
        if (existing.namespace, existing.name) != (ref.namespace, ref.name):
            return None
        if not self.spec_stale(existing):
            return existing
        claim = self.recorded_claim(ref, existing)
        if claim is None:
            return None  # written by an older version: the API object has what is needed
        return self._repeat(claim, existing, claim.results_for(self.driver))

    def recorded_claim(self, ref: ClaimRef, record: ClaimRecord) -> Claim | None:
        """The claim as it was prepared, rebuilt from its record; None when not kept."""
        if record.allocation is None:
            return None
        try:
            results, configs = parse_devices(record.allocation, str(ref))
        except ClaimError:
            return None  # cannot happen for what we wrote; the API object is the fallback
        pod_claim_name = record.metadata.pod_claim_name if record.metadata else None
        return Claim(ref=ref, allocated=True, results=results, configs=configs,
                     pod_claim_name=pod_claim_name)

    def spec_stale(self, existing: ClaimRecord) -> bool:
        """The spec or a metadata file is missing, or the node rebooted since they were
        written.

        ``/var/run/cdi`` is tmpfs, and every existing driver once answered with CDI IDs whose
        spec was gone.
        """
        spec_missing = bool(existing.devices) and not Path(existing.spec_path).exists()
        return (spec_missing or existing.boot_id != self.boot_id
                or self.metadata.missing(existing))

    def _repeat(
        self, claim: Claim, existing: ClaimRecord, results: Sequence[AllocatedDevice]
    ) -> ClaimRecord:
        """A prepare of a prepared claim: same answer; rewrite the spec if it was lost."""
        ref = claim.ref
        if not self.spec_stale(existing):
            return existing
        spec_missing = bool(existing.devices) and not Path(existing.spec_path).exists()
        fresh = existing
        if existing.devices:
            fresh = self.rewrite(claim, existing, results, self.inventory().by_name())
        fresh = replace(fresh, boot_id=self.boot_id, updated=now(),
                        allocation=allocation_json(claim, self.driver))
        self.store(ref, lambda claims: claims.__setitem__(ref.uid, fresh))
        self.update_gauges()
        log.info(
            "rewrote CDI spec of a prepared claim",
            extra={"claim": ref.uid, "reason": "missing" if spec_missing else "reboot",
                   "device_metadata": len(fresh.metadata.requests) if fresh.metadata else 0},
        )
        return fresh

    def rewrite(
        self, claim: Claim, record: ClaimRecord, results: Sequence[AllocatedDevice],
        inventory: dict[str, Device],
    ) -> ClaimRecord:
        """Write a prepared claim's metadata files and spec again from ``inventory``; the
        record as it is then (not stored). A claim prepared without metadata files stays so;
        with the feature switched off since, its files go."""
        if self.partitions is not None:
            from agent.prepare.partitions import overlay

            inventory = overlay(record, self.pool, inventory)
        devices = mps_edits(claim.ref, [self.spec_device(claim, r, inventory) for r in results],
                            self.mps_pipe_dir)
        if self.vfs is not None:
            # A reboot drops the VFs the agent made (the PF is back at 0 VFs, its candidates
            # under the same names): make them again, on the drivers and caps the claim asked
            # for, before the spec names them. Nothing to save first: until the rewritten
            # record is stored, the next start-up does this again, and finds it done.
            record, devices = self.vfs.prepare(claim.ref, record, devices, lambda _: None)
            inventory = {**inventory, **{d.device.name: d.device for d in devices}}
        files, devices, metadata = self.metadata.plan(
            claim, results, devices, wanted=record.metadata is not None)
        self.metadata.write(claim.ref, files)
        apply_time_slices(claim.ref, devices, self.gpu_control)  # a reboot reset them
        if devices:
            self.write_spec(claim.ref, devices)
        if metadata is None and record.metadata is not None:
            self.metadata.remove(record)
        return replace(record, boot_id=self.boot_id, updated=now(), metadata=metadata,
                       devices=identified(record.devices, self.pool, inventory))

    def spec_device(
        self, claim: Claim, result: AllocatedDevice, inventory: dict[str, Device]
    ) -> SpecDevice:
        ref = claim.ref
        device = inventory.get(result.device) if result.pool == self.pool else None
        if device is None:
            raise UnknownDeviceError(
                str(ref),
                f"device {result.pool}/{result.device} (request {result.request}) does not "
                f"exist on node {self.node_name}; the allocation is stale or the device was "
                "removed, so delete and re-create the claim",
            )
        try:
            configs = claim.configs_for(self.driver, result)
            config = merge_configs(
                (c.parameters for c in configs if c.source != "FromClass"),
                class_params=(c.parameters for c in configs if c.source == "FromClass"),
            )
        except ConfigDecodeError as err:
            raise BadConfigError(
                str(ref), f"opaque config for request {result.base_request}: {err}"
            ) from err
        env = device_env(result, device, config)
        item = spec_device(ref, result, device, env, config)
        check_config(ref, item, result.base_request)
        return item

    def network_status(self, claim: Claim) -> list[NicStatus]:
        """What the claim's ``status.devices`` should say about its NICs, after a prepare."""
        inventory = self.inventory().by_name()
        out: list[NicStatus] = []
        for result in claim.results_for(self.driver):
            device = inventory.get(result.device) if result.pool == self.pool else None
            if device is not None and device.type in NETDEV_TYPES:
                out.append(nic_status(result, self.spec_device(claim, result, inventory)))
        return out

    def _prepared(self, ref: ClaimRef, result: AllocatedDevice) -> PreparedDevice:
        return PreparedDevice(
            pool=result.pool,
            device=result.device,
            requests=(result.base_request,),
            cdi_ids=(self.specs.cdi_id(ref.uid, result.device, result.share_id),),
            share_id=result.share_id,
            admin_access=result.admin_access,
            consumed=result.consumed_capacity,
        )

    def _check_free(
        self, ref: ClaimRef, results: Sequence[AllocatedDevice], claims: dict[str, ClaimRecord]
    ) -> None:
        """Refuse a device another claim holds, unless admin access or a share makes it legal.

        The driver is the last line of defence against a double allocation (a stale scheduler
        cache, a force-deleted pod whose claim was re-allocated before unprepare).
        """
        for result in results:
            if result.admin_access:
                continue
            for other, held in holders(claims, result.pool, result.device, besides=ref.uid):
                if held.admin_access or (result.share_id and held.share_id):
                    continue
                owner = f"{other.namespace}/{other.name} ({other.uid})"
                raise DeviceTakenError(
                    str(ref),
                    f"device {result.pool}/{result.device} is already prepared for claim "
                    f"{owner}; it is released when the pods using that claim are gone",
                )

    def write_spec(self, ref: ClaimRef, devices: Sequence[SpecDevice]) -> None:
        env = (
            f"DRA_AGENT_CLAIM={ref.namespace}/{ref.name}",
            f"DRA_AGENT_CLAIM_UID={ref.uid}",
            f"DRA_AGENT_NODE={self.node_name}",
        )
        try:
            self.specs.write(ref, devices, env)
        except CDIError as err:  # names the file and the cause already
            raise SpecWriteError(str(ref), str(err)) from err
        except OSError as err:
            raise SpecWriteError(
                str(ref), f"cannot write CDI spec {self.specs.path(ref.uid)}: {err}"
            ) from err

    def store(
        self,
        ref: ClaimRef,
        change: Callable[[dict[str, ClaimRecord]], None],
        durable: bool = True,
    ) -> None:
        try:
            self.checkpoint.update(change, durable=durable)
        except CheckpointWriteError as err:
            raise CheckpointUnavailableError(str(ref), str(err)) from err

    def _rollback(self, record: ClaimRecord) -> None:
        """Undo a failed prepare. If the spec or a metadata file cannot be removed, the
        PrepareStarted record stays, so the next prepare or the next start-up finishes it."""
        uid = record.uid
        try:
            self.specs.remove(uid)
            self.metadata.remove(record)
            self.checkpoint.update(lambda claims: claims.pop(uid, None))
        except Exception:  # the original error matters more than this one
            log.exception("rollback of a failed prepare failed", extra={"claim": uid})

    # -- unprepare ------------------------------------------------------------------------

    def unprepare(self, uid: str, ref: ClaimRef | None = None) -> None:
        """Undo a prepare. Unknown claims succeed: the spec name derives from the UID alone.

        The kubelet also unprepares claims whose prepare failed, and an error keeps their pod
        terminating for ever. A UID that prepare refuses (``uid_problem``) never got a spec, so
        no path is built from it: only a checkpoint record of that key, if any, goes.
        Metadata files go by the record's names; with none recorded (a record adopted from a
        spec after a corrupt checkpoint, or none at all), by the kubelet's ``ref``.
        """
        hit(self.failpoints, Point.UNPREPARE_AFTER_STARTED, uid)
        claims = self.checkpoint.claims()
        record = claims.get(uid)
        if uid_problem(uid) is None:
            self.specs.remove(uid)
        elif record is None:
            return
        if record is not None and record.metadata is not None:
            self.metadata.remove(record)
        elif ref is not None and ref.uid == uid:
            self.metadata.remove_unrecorded(ref, claims)
        if self.partitions is not None and record is not None:  # an error: the kubelet retries
            self.partitions.release(str(ref) if ref is not None else uid, record)
            hit(self.failpoints, Point.MIG_AFTER_DESTROYED, uid)
        if self.vfs is not None and record is not None:  # rebound VFs get their driver back
            self.vfs.release(str(ref) if ref is not None else uid, record)
        sliced = record is not None and any(d.time_slice for d in record.devices)
        if sliced:
            # While the record is there: a crash after it is gone would leave the interval
            # set with nothing naming it. Again once it is gone (below): two shares of one
            # GPU unprepared at once each see the other here.
            self._release_time_slices(record)
        hit(self.failpoints, Point.UNPREPARE_AFTER_SPEC_REMOVED, uid)
        self.checkpoint.update(lambda claims: claims.pop(uid, None))
        if sliced:
            self._release_time_slices(record)
        hit(self.failpoints, Point.UNPREPARE_AFTER_COMPLETED, uid)
        self.update_gauges()

    def _release_time_slices(self, record: ClaimRecord | None) -> None:
        if record is not None:
            release_time_slices(record, self.checkpoint.claims(), self.inventory().by_name(),
                                self.gpu_control)

    # -- gauges ---------------------------------------------------------------------------

    def update_gauges(self) -> None:
        claims = self.checkpoint.claims()
        self.metrics.prepared_claims.set(len(claims))
        self.metrics.prepared_devices.set(sum(len(r.devices) for r in claims.values()))
        # Rebuilt whole, never incremented: exact after a restart, an unprepare, a recovery.
        self.metrics.claim_devices.set(
            ClaimDevice(
                namespace=r.namespace, claim=r.name, pool=d.pool, device=d.device,
                uuid=d.uuid or "", pci_bus_id=d.pci_address or "", ifname=d.if_name or "",
            )
            for _, r in sorted(claims.items())
            for d in r.devices
        )
