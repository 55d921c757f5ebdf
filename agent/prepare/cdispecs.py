"""One transient CDI spec per claim, as the DESIGN fixes it.

* kind ``k8s.<driver>/claim``; file ``k8s.<driver>-claim_<claimUID>.json`` in the CDI dir;
* device names ``<claimUID>-<device>`` (unique per claim, so two claims never define the same
  qualified name, which would make both unusable); a share of a device (KEP-5075) is
  ``<claimUID>-<device>_<shareID>``, its own CDI device, since one claim may hold two shares
  of one device (``_`` is in no device name, so the name still parses back);
* each device's edits are its hardware edits (``DeviceEdits``, e.g. ``cdi.edits.EditsProvider``)
  plus env describing it and the bind mounts of the claim's device metadata files (on the
  first device of each request, ``agent.prepare.metadata``); a NIC's netdev moves into the
  pod only when the claim's opaque config asks for it (``SpecDevice.move_netdev``);
* the spec-level edits are what every container using any device of the claim needs once: the
  provider's common edits (NVIDIA control nodes, driver libraries and hooks, ``/dev/vfio/vfio``,
  ``rdma_cm``), when it has any (``CommonEdits``), plus the claim-level env;
* the lowest cdiVersion the content needs (``cdi.spec`` computes it);
* mode 0600 (``cdi.files.SPEC_FILE_MODE``, which says why), at most ``MAX_SPEC_BYTES``.

At start-up the specs of ours are the evidence of what was prepared, so each file under one of
our names is read as untrusted (``agent.common.safefile``): a symlink, FIFO, device, a file over the
cap, or one that does not parse (too deep, bad UTF-8) is set aside as
``.<name>.corrupt-<unix ts>`` (a name runtimes ignore), logged once, and its UID still counts
with no devices. A claim whose record survives gets its spec rewritten on the next prepare.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.claim.identity import uid_problem
from agent.claim.model import ClaimRef
from agent.common.k8snames import dns_label_problem
from agent.common.safefile import UnsafeFileError, read_capped
from agent.prepare.devices import SpecDevice
from cdi.annotations import annotations_for
from cdi.atomicfile import FileOps, volatile_fs
from cdi.errors import CDIWriteError
from cdi.files import claim_spec_file_name, remove_spec, write_spec
from cdi.spec import CDIDevice, ContainerEdits, Spec
from discovery.model import Device

log = logging.getLogger(__name__)

CLASS = "claim"
#: Largest claim spec written or read back. A real one is a few KiB (per device: its nodes,
#: driver mounts and hooks, a few variables); 16 MiB is the checkpoint's cap too, whose
#: measured cost fits the DaemonSet's memory limit (agent.checkpoint.store). Start-up reads
#: the specs one at a time, so that is also the peak of the whole scan.
MAX_SPEC_BYTES = 16 << 20


#: Between a device's name and its share ID in a CDI device name.
SHARE_SEPARATOR = "_"


def cdi_device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """The CDI device name of one device (or one share of it) of a claim."""
    name = f"{claim_uid}-{device}"
    return f"{name}{SHARE_SEPARATOR}{share_id}" if share_id else name


class ClaimSpecs(Protocol):
    """The per-claim CDI spec files (the seam to ``cdi``; tests may pass their own)."""

    def cdi_id(self, claim_uid: str, device: str, share_id: str | None = None) -> str: ...

    def path(self, claim_uid: str) -> Path: ...

    def write(self, claim: ClaimRef, devices: Sequence[SpecDevice], env: Sequence[str], *,
              durable: bool = True) -> Path:
        """Write the claim's spec atomically; with ``durable`` a power loss keeps it too
        (where anything can: not on tmpfs). OSError-derived errors on failure."""
        ...

    def remove(self, claim_uid: str) -> None:
        """Remove the claim's spec, not durably: a removal a power loss undoes leaves a spec
        that start-up removes (no completed record explains it) or that still goes with its
        record (whose removal was lost too)."""
        ...

    def claim_devices(self) -> dict[str, list[str]]:
        """Claim UID -> device names, for every claim spec of ours in the CDI directory;
        an unreadable one is set aside and listed in ``corrupt_copies``."""
        ...

    @property
    def corrupt_copies(self) -> list[Path]: ...

    def annotations(self, claim_uid: str, cdi_ids: Sequence[str]) -> dict[str, str]: ...


class DeviceEdits(Protocol):
    """Hardware container edits of one device (``cdi.edits.EditsProvider`` fits).

    ``move_netdev`` asks for a NIC's host interface to move into the pod, named
    ``interface_name`` there (None: its host name); other devices ignore both.
    """

    def edits_for(
        self, device: Device, *, interface_name: str | None = None, move_netdev: bool = False
    ) -> ContainerEdits: ...


@runtime_checkable
class CommonEdits(Protocol):
    """Edits shared by the devices of a claim, once per spec (``EditsProvider`` has them)."""

    def common_edits_for(self, devices: Sequence[Device]) -> ContainerEdits: ...


class EnvOnlyEdits:
    """No hardware edits: what a simulated node, without device nodes, can offer."""

    def edits_for(
        self, device: Device, *, interface_name: str | None = None, move_netdev: bool = False
    ) -> ContainerEdits:
        return ContainerEdits()


class CDIClaimSpecs:
    """``ClaimSpecs`` on a real CDI directory."""

    def __init__(
        self, cdi_dir: Path, driver: str, edits: DeviceEdits,
        clock: Callable[[], float] = time.time, *,
        volatile: Callable[[Path], bool] = volatile_fs, ops: FileOps | None = None,
    ) -> None:
        self.cdi_dir = cdi_dir
        self._clock = clock
        #: Whether the directory is on tmpfs (asked once it exists; None until then).
        self._volatile_fs = volatile
        self._volatile: bool | None = None
        self._ops = ops
        #: Where unreadable specs of ours were moved at start-up, during this process's life.
        self.corrupt_copies: list[Path] = []
        self.vendor = f"k8s.{driver}"
        self.kind = f"{self.vendor}/{CLASS}"
        self.edits = edits
        #: Checked once: a provider without common edits (EnvOnlyEdits, a test's) is fine.
        self._common = edits if isinstance(edits, CommonEdits) else None
        self._prefix = f"{self.vendor}-{CLASS}_"

    def cdi_id(self, claim_uid: str, device: str, share_id: str | None = None) -> str:
        return f"{self.kind}={cdi_device_name(claim_uid, device, share_id)}"

    def path(self, claim_uid: str) -> Path:
        return self.cdi_dir / claim_spec_file_name(self.vendor, CLASS, claim_uid)

    def build(self, claim: ClaimRef, devices: Sequence[SpecDevice], env: Sequence[str]) -> Spec:
        """The claim's spec; ``DeviceEditsError`` (a ``CDIError``) when the host lacks a part."""
        common = ContainerEdits()
        if self._common is not None:
            common = self._common.common_edits_for([d.device for d in devices])
        cdi_devices = []
        for item in devices:
            hardware = self.edits.edits_for(
                item.device, interface_name=item.interface_name, move_netdev=item.move_netdev
            )
            # A node both lists (e.g. /dev/kfd) is injected once, from the spec-level edits.
            edits = hardware.without(common).merge(
                ContainerEdits(env=item.env, mounts=item.mounts, hooks=item.hooks))
            # Every variable of the agent's own (the claim's, and guards such as
            # NVIDIA_VISIBLE_DEVICES=void) comes last in each device's edits: CDI applies
            # device edits after spec-level ones and a later name replaces an earlier one, so
            # no config's env listed before them can change them.
            edits = edits.merge(ContainerEdits(env=(*env, *common.env)))
            name = cdi_device_name(claim.uid, item.device.name, item.share_id)
            cdi_devices.append(CDIDevice(name=name, container_edits=edits))
        spec_edits = ContainerEdits(device_nodes=common.device_nodes, mounts=common.mounts,
                                    hooks=common.hooks, net_devices=common.net_devices)
        return Spec(kind=self.kind, devices=tuple(cdi_devices), container_edits=spec_edits)

    def write(self, claim: ClaimRef, devices: Sequence[SpecDevice], env: Sequence[str], *,
              durable: bool = True) -> Path:
        spec = self.build(claim, devices, env)
        return write_spec(self.cdi_dir, self.path(claim.uid).name, spec,
                          max_bytes=MAX_SPEC_BYTES, ops=self._ops,
                          durable=durable and not self._on_volatile_fs())

    def _on_volatile_fs(self) -> bool:
        """The CDI directory is on tmpfs (``/var/run/cdi`` on most nodes): no fsync keeps a
        file there across a power loss, so none is made. Asked of the kernel once the
        directory exists; a bind mount over it while the agent runs is not followed."""
        if self._volatile is None:
            try:
                self.cdi_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            except OSError:
                return False  # write_spec says why, in its own error; asked again next time
            self._volatile = self._volatile_fs(self.cdi_dir)
        return self._volatile

    def remove(self, claim_uid: str) -> None:
        try:
            remove_spec(self.cdi_dir, self.path(claim_uid).name, ops=self._ops, durable=False)
        except CDIWriteError as err:
            if isinstance(err.__cause__, NotADirectoryError):
                return  # no CDI directory, so certainly no spec in it
            raise

    def claim_devices(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return out
        for name in names:
            if not (name.startswith(self._prefix) and name.endswith(".json")):
                continue
            uid = name[len(self._prefix) : -len(".json")]
            # Any UID prepare accepts may have a spec here (and need removing at start-up).
            if uid_problem(uid) is not None:
                continue
            out[uid] = self._devices_in(self.cdi_dir / name, uid)
        return out

    def _devices_in(self, path: Path, uid: str) -> list[str]:
        """Device names in one of our specs; [] when unreadable (its UID still counts), and an
        untrustworthy file is set aside so neither we nor a runtime read it again."""
        try:
            doc = json.loads(read_capped(path, MAX_SPEC_BYTES))
            names = [d["name"] for d in doc.get("devices", [])]
            ours = [n[len(uid) + 1 :].split(SHARE_SEPARATOR, 1)[0] for n in names
                    if isinstance(n, str) and n.startswith(uid + "-")]
            # The names become device names of an adopted record: ResourceSlice device names,
            # so DNS labels (which also keeps NUL, surrogates and newlines out of the record).
            for device in ours:
                if (why := dns_label_problem(device)) is not None:
                    raise ValueError(f"device name {device!a} {why}")
        except FileNotFoundError:
            return []  # removed since the listing (the other instance of a rolling update)
        except (OSError, UnsafeFileError, ValueError, KeyError, TypeError, AttributeError,
                RecursionError) as err:  # ValueError: bad UTF-8 and JSON; RecursionError: depth
            self._set_aside(path, uid, err)
            return []
        return ours

    def _set_aside(self, path: Path, uid: str, err: Exception) -> None:
        copy = path.with_name(f".{path.name}.corrupt-{int(self._clock())}")
        try:
            os.replace(path, copy)
            self.corrupt_copies.append(copy)
            moved = str(copy)
        except OSError as move_err:
            moved = f"not moved: {move_err.strerror or move_err}"
        log.error(
            "CDI spec of ours unreadable at start-up; set aside, its devices are not known",
            extra={"claim": uid, "path": str(path), "copy": moved,
                   "cause": f"{type(err).__name__}: {str(err)!a:.200}"},
        )

    def annotations(self, claim_uid: str, cdi_ids: Sequence[str]) -> dict[str, str]:
        """The ``cdi.k8s.io/`` annotation the kubelet's DRA manager once set per claim."""
        return annotations_for(self.vendor.removeprefix("k8s."), claim_uid, cdi_ids)
