"""What one claim's CDI spec and record are, from its allocation, the inventory and the effects.

``ClaimBuilder`` is the part of preparation that both a prepare and start-up recovery need: the
spec devices of a claim (its env, its opaque config checked), the provisional record that
reserves them, the spec file itself, and the rewrite of a prepared claim's spec after a reboot
or a lost file (every effect re-applied in order). It changes nothing on the host itself and
writes nothing to the checkpoint: the preparer and recovery decide when records are stored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
from agent.claim.model import AllocatedDevice, Claim, ClaimError, ClaimRef
from agent.claim.opaque import ConfigDecodeError, merge_configs
from agent.claim.parse import allocation_json, parse_devices
from agent.prepare.cdispecs import ClaimSpecs
from agent.prepare.devices import (
    SpecDevice,
    check_pod_interfaces,
    device_env,
    identified,
    spec_device,
)
from agent.prepare.effects.base import Effect, Step
from agent.prepare.errors import BadConfigError, SpecWriteError, UnknownDeviceError
from agent.prepare.shares import check_config
from cdi.errors import CDIError
from discovery.model import Device


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ClaimBuilder:
    def __init__(self, *, driver: str, pool: str, node_name: str, specs: ClaimSpecs,
                 boot_id: str, effects: Sequence[Effect]) -> None:
        self.driver = driver
        self.pool = pool
        self.node_name = node_name
        self.specs = specs
        self.boot_id = boot_id
        self.effects = tuple(effects)

    # -- a first prepare ------------------------------------------------------------------

    def plan(self, claim: Claim, results: Sequence[AllocatedDevice],
             inventory: dict[str, Device]) -> Step:
        """The claim's spec devices and its PrepareStarted record, every effect planned;
        nothing written. A per-claim ``ClaimError`` when the claim cannot be prepared."""
        ref = claim.ref
        devices = [self.spec_device(claim, r, inventory) for r in results]
        check_pod_interfaces(ref, devices)
        prepared = identified([self.prepared(ref, r, d.sharing.time_slice)
                               for r, d in zip(results, devices, strict=True)],
                              self.pool, inventory)
        cdi_ids = [i for d in prepared for i in d.cdi_ids]
        record = ClaimRecord(
            uid=ref.uid, namespace=ref.namespace, name=ref.name,
            state=ClaimState.PREPARE_STARTED, devices=prepared,
            cdi_annotations=self.specs.annotations(ref.uid, cdi_ids) if cdi_ids else {},
            spec_path=str(self.specs.path(ref.uid)), boot_id=self.boot_id, updated=now(),
            allocation=allocation_json(claim, self.driver),
        )
        step = Step(claim=claim, results=results, record=record, devices=devices,
                    pool=self.pool)
        for effect in self.effects:
            effect.plan(step)
        return step

    def prepared(self, ref: ClaimRef, result: AllocatedDevice,
                 time_slice: str | None = None) -> PreparedDevice:
        return PreparedDevice(
            pool=result.pool,
            device=result.device,
            requests=(result.base_request,),
            cdi_ids=(self.specs.cdi_id(ref.uid, result.device, result.share_id),),
            share_id=result.share_id,
            admin_access=result.admin_access,
            consumed=result.consumed_capacity,
            time_slice=time_slice,
        )

    def spec_device(
        self, claim: Claim, result: AllocatedDevice, inventory: Mapping[str, Device]
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

    def write_spec(self, ref: ClaimRef, devices: Sequence[SpecDevice]) -> None:
        env = (
            f"DRA_AGENT_CLAIM={ref.namespace}/{ref.name}",
            f"DRA_AGENT_CLAIM_UID={ref.uid}",
            f"DRA_AGENT_NODE={self.node_name}",
        )
        try:
            # Not durable while the boot ID is known: after a power loss start-up rebuilds
            # every completed claim's spec (a new boot ID makes it stale) and removes the
            # others, before the plugin registers; without one it cannot tell a reboot.
            self.specs.write(ref, devices, env, durable=not self.boot_id)
        except CDIError as err:  # names the file and the cause already
            raise SpecWriteError(str(ref), str(err)) from err
        except OSError as err:
            raise SpecWriteError(
                str(ref), f"cannot write CDI spec {self.specs.path(ref.uid)}: {err}"
            ) from err

    # -- a prepared claim ------------------------------------------------------------------

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

    def spec_missing(self, record: ClaimRecord) -> bool:
        return bool(record.devices) and not Path(record.spec_path).exists()

    def spec_stale(self, record: ClaimRecord) -> bool:
        """The spec or what an effect made (a metadata file) is missing, or the node
        rebooted since they were written.

        ``/var/run/cdi`` is tmpfs, and every existing driver once answered with CDI IDs whose
        spec was gone.
        """
        return (self.spec_missing(record) or record.boot_id != self.boot_id
                or any(e.stale(record) for e in self.effects))

    def rewrite(
        self, claim: Claim, record: ClaimRecord, results: Sequence[AllocatedDevice],
        inventory: dict[str, Device],
    ) -> ClaimRecord:
        """Write a prepared claim's spec again from ``inventory``, each effect planned and
        re-applied in turn (a reboot dropped VFs and time slices; a metadata file was lost);
        the record as it is then (not stored)."""
        step = Step(claim=claim, results=results, record=record, pool=self.pool,
                    devices=[self.spec_device(claim, r, inventory) for r in results],
                    rewrite=True)
        for effect in self.effects:
            effect.plan(step)
            effect.reapply(step)
        if step.devices:
            self.write_spec(claim.ref, step.devices)
        now_held = {**inventory, **{d.device.name: d.device for d in step.devices}}
        return replace(step.record, boot_id=self.boot_id, updated=now(),
                       devices=identified(step.record.devices, self.pool, now_held))
