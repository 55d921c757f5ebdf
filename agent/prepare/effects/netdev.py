"""A moved interface configured in the pod (``netdev:`` addresses, mtu, hardwareAddress,
routes, ethtool, rdma) as an effect; docs/netdev.md says why this is an OCI hook.

* ``plan``: what only the host can answer, before anything changes: the hook is installed,
  the MTU is within the device's own range, ``rdma: exclusive`` has an RDMA device and a
  kernel in exclusive netns mode, no two interfaces of the claim share an address or a MAC.
  Then the device's CDI edits get the ``createRuntime`` hook, its config in the arguments
  (the spec is per claim, written and removed with it, rebuilt with it after a reboot:
  nothing else to keep in step).
* ``apply``: for ``rdma: exclusive``, the record names the RDMA device (durably) before the
  spec that lets the hook move it is written.
* ``release``: the RDMA device back to the host's namespace when the pod's namespace still
  holds it (the kernel returns it itself when the namespace is destroyed), found by what the
  hook recorded before the move, checked against what discovery publishes now; then that
  record goes. At start-up the same for the records of claims no longer prepared.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import ClaimRef
from agent.netdev.host import NetdevHost, read_moved
from agent.netdev.install import HookLaunch
from agent.prepare.devices import SpecDevice
from agent.prepare.effects.base import BaseEffect, Reconciled, Release, Step, refused
from agent.prepare.errors import BadConfigError
from cdi.spec import Hook
from discovery.model import Inventory

log = logging.getLogger(__name__)

#: PreparedDevice.extra: {"rdmaDevice": name} of a device whose RDMA device the hook moves.
RDMA = "netdevRdma"
#: Seconds the runtime gives the hook (it takes well under one; a hung netlink must not hang
#: the pod's start for ever).
HOOK_TIMEOUT_S = 30


class NetdevEffect(BaseEffect):
    name = "netdev"
    manual_fix = ("from inside the pod's network namespace, rdma dev set <device> netns "
                  "<host namespace> (or delete the namespace: the kernel returns it)")

    def __init__(self, state_dir: Path, launch: Callable[[], HookLaunch | None],
                 host: NetdevHost, inventory: Callable[[], Inventory]) -> None:
        self.state_dir = state_dir
        self.launch = launch
        self.host = host
        self.inventory = inventory

    def state_file(self, uid: str, device: str) -> Path:
        return self.state_dir / uid / f"{device}.json"

    def touches(self, record: ClaimRecord) -> bool:
        return any(RDMA in d.extra for d in record.devices)

    def plan(self, step: Step) -> None:
        configured = [(i, d) for i, d in enumerate(step.devices) if d.netconf is not None]
        if not configured:
            return
        launch = self.launch()
        if launch is None:
            raise BadConfigError(str(step.ref), "netdev: this node has no netdev hook "
                                 "installed (the chart's install-netdev-hook init "
                                 "container); drop the interface settings or install it")
        seen: dict[str, str] = {}
        for i, item in configured:
            self._check(step.ref, item, seen)
            step.devices[i] = replace(item, hooks=(self._hook(launch, step.ref.uid, item),))

    def _check(self, ref: ClaimRef, item: SpecDevice, seen: dict[str, str]) -> None:
        config, device = item.netconf, item.device
        assert config is not None

        def bad(message: str) -> BadConfigError:
            return BadConfigError(str(ref), f"netdev: device {device.name}: {message}")

        for value in (*(str(a.ip) for a in config.addresses or ()),
                      *([config.hardware_address] if config.hardware_address else [])):
            if value in seen:
                raise bad(f"{value} is given to {seen[value]} too; a claim-wide config "
                          "applies to each device: give each request its own")
            seen[value] = device.name
        if config.mtu is not None and device.host.if_name:
            link = self.host.link(device.host.if_name)
            low, high = (link.min_mtu, link.max_mtu) if link else (None, None)
            if (low and config.mtu < low) or (high and config.mtu > high):
                raise bad(f"mtu {config.mtu} is outside what {device.host.if_name} takes "
                          f"({low}-{high})")
        if config.rdma_exclusive:
            if not device.host.rdma_device:
                raise bad("rdma: exclusive, but the device has no RDMA device")
            mode = self.host.rdma_mode()
            if mode != "exclusive":
                raise bad(f"rdma: exclusive needs the kernel's RDMA netns mode exclusive "
                          f"(rdma system set netns exclusive); it is {mode or 'not there'}")

    def _hook(self, launch: HookLaunch, uid: str, item: SpecDevice) -> Hook:
        config = item.netconf
        assert config is not None
        args = [*launch.args, f"--interface={item.pod_interface}",
                f"--config={json.dumps(config.to_json(), separators=(',', ':'))}",
                f"--claim={uid}"]
        if config.rdma_exclusive:
            args += [f"--rdma-device={item.device.host.rdma_device}",
                     f"--state={self.state_file(uid, item.device.name)}"]
        return Hook("createRuntime", launch.path, tuple(args), launch.env, HOOK_TIMEOUT_S)

    def apply(self, step: Step) -> None:
        marks = {d.device.name: {RDMA: {"rdmaDevice": d.device.host.rdma_device}}
                 for d in step.devices if d.netconf is not None and d.netconf.rdma_exclusive}
        if not marks:
            return
        step.record = replace(step.record, devices=tuple(
            replace(h, extra={**h.extra, **marks[h.device]}) if h.device in marks else h
            for h in step.record.devices))
        step.save(step.record, durable=True)  # before the spec lets the hook move it

    def release(self, how: Release) -> None:
        if how.record is None:
            return
        published = {d.name: d for d in self.inventory().devices}
        for held in how.record.devices:
            mark = held.extra.get(RDMA)
            if mark is None:
                continue
            if held.admin_access:  # admin access moves nothing: the record was written by hand
                refused(how.claim, held.device, RDMA, "the device is held with admin access, "
                        "which moves nothing")
                continue
            device = published.get(held.device)
            wanted = mark.get("rdmaDevice") if isinstance(mark, Mapping) else None
            if device is None or not device.host.rdma_device or wanted != \
                    device.host.rdma_device:
                refused(how.claim, held.device, RDMA, "not the RDMA device discovery "
                        "publishes for this device now")
                continue
            self._give_back(how.claim, how.uid, held.device, device.host.rdma_device)

    def _give_back(self, claim: str, uid: str, device: str, rdma_device: str) -> None:
        path = self.state_file(uid, device)
        try:
            moved = read_moved(path)
        except (OSError, ValueError) as err:
            log.warning("netdev hook record unreadable; the RDMA device is left to the "
                        "kernel's return at namespace exit", extra={
                            "claim": claim, "device": device, "path": str(path),
                            "error": str(err)[:200]})
            moved = None
        if moved is not None and moved.rdma_device != rdma_device:
            refused(claim, device, "rdmaDevice", f"the hook's record names "
                    f"{moved.rdma_device!a:.40}, discovery publishes {rdma_device}")
            moved = None
        if moved is not None:
            what = self.host.give_back(moved)  # NetlinkError: the kubelet retries unprepare
            log.info("RDMA device given back to the host", extra={
                "claim": claim, "device": device, "rdma": moved.rdma_device,
                "netns": moved.netns, "result": what})
        _remove(path)

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        """The hook's records of claims no longer prepared: their devices given back."""
        removed: list[str] = []
        try:
            uids = os.listdir(self.state_dir)
        except FileNotFoundError:
            return Reconciled()
        if corrupt:
            return Reconciled()  # what no record names may still be a claim's
        published = {d.host.rdma_device: d.name for d in self.inventory().devices
                     if d.host.rdma_device}
        for uid in (u for u in uids if u not in claims):
            folder = self.state_dir / uid
            if folder.is_symlink() or not folder.is_dir():
                continue  # not one the hook makes: left as it is
            for entry in sorted(e for e in os.listdir(folder) if e.endswith(".json")):
                path = folder / entry
                try:
                    moved = read_moved(path)
                    if moved is not None and moved.rdma_device in published:
                        self.host.give_back(moved)
                except (OSError, ValueError) as err:
                    log.warning("netdev hook record of a claim not prepared left as it is",
                                extra={"claim": uid, "path": str(path), "error": str(err)})
                    continue
                _remove(path)
                removed.append(str(path))
        return Reconciled(removed=tuple(removed))


def _remove(path: Path) -> None:
    # Absent already, or the directory still holds another device's record: either is fine.
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(path.parent)
