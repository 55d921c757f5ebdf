"""The preparer's side of device metadata: which files a claim gets, and their life cycle.

The files follow the claim's CDI spec step by step (``DevicePreparer``):

* **prepare** plans them before anything is written (a request or annotation that cannot be
  a path segment fails the claim then), records them in the PrepareStarted record, writes them
  before the spec (the spec never names a file that is not there), and a failure anywhere
  removes them with the spec;
* **a repeated prepare, a reboot** (new boot ID) **or a lost file** rewrites both, from the
  record and the current inventory, exactly as the spec alone was before;
* **unprepare** removes the files the record lists (missing ones are fine), or, when the
  record lists none (adopted from a spec after a corrupt checkpoint), those under the claim
  name the kubelet sends, as the helper does;
* **start-up** removes files no record explains (a crash between writing them and the
  durable PrepareCompleted record), unless the checkpoint was corrupt: then, like spec files,
  they are the best evidence there is and stay until a record explains them or a clean start.

Upstream's host layout is keyed by namespace and name, not UID, so two claims of one name (a
claim deleted and re-created while the old one is still prepared here) would share files.
The second is refused until the first is unprepared, as a device held by another claim is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.checkpoint.model import ClaimRecord, MetadataRecord
from agent.claim.identity import name_problem
from agent.claim.model import AllocatedDevice, Claim, ClaimRef
from agent.prepare.devices import SpecDevice
from agent.prepare.errors import DeviceMetadataError
from agent.prepare.metadata import MetadataFile, claim_dir, host_path, names_problem, plan
from agent.prepare.metadatafiles import HostMetadataFiles, MetadataFileError

log = logging.getLogger(__name__)


class ClaimMetadata:
    """Device metadata for the claims of one driver; ``enabled`` is ``--device-metadata``.

    With ``files`` None nothing is ever written or removed (a preparer built without a
    plugin directory, in tests). Disabled, files recorded earlier are still removed.
    """

    def __init__(self, driver: str, files: HostMetadataFiles | None, enabled: bool) -> None:
        self.driver = driver
        self.files = files
        self.enabled = enabled and files is not None

    def plan(
        self, claim: Claim, results: Sequence[AllocatedDevice], devices: Sequence[SpecDevice],
        *, wanted: bool = True,
    ) -> tuple[tuple[MetadataFile, ...], list[SpecDevice], MetadataRecord | None]:
        """The claim's files, its spec devices with their mounts, and what the record keeps;
        nothing when disabled, not ``wanted`` (a claim first prepared without), or no device
        of ours. Raises ``DeviceMetadataError`` for names that cannot be path segments."""
        if not (self.enabled and wanted and results) or self.files is None:
            return (), list(devices), None
        ref = claim.ref
        if (why := names_problem(ref, claim.pod_claim_name, results)) is not None:
            raise DeviceMetadataError(str(ref), f"device metadata: {why}")
        files, with_mounts = plan(self.driver, self.files.root, ref,
                                  pod_claim_name=claim.pod_claim_name, results=results,
                                  devices=devices)
        record = MetadataRecord(requests=tuple(f.request for f in files),
                                pod_claim_name=claim.pod_claim_name)
        return files, with_mounts, record

    def check_unshared(self, ref: ClaimRef, claims: Mapping[str, ClaimRecord]) -> None:
        """Refuse files another prepared claim (same namespace and name, other UID) has."""
        for other in claims.values():
            if other.uid == ref.uid or other.metadata is None:
                continue
            if (other.namespace, other.name) == (ref.namespace, ref.name):
                raise DeviceMetadataError(
                    str(ref),
                    f"device metadata files of this claim's name are still held by claim "
                    f"{other.namespace}/{other.name} ({other.uid}), an earlier claim of the "
                    "same name; they are released when the pods using that claim are gone",
                )

    def write(self, ref: ClaimRef, files: Sequence[MetadataFile]) -> None:
        if not files or self.files is None:
            return
        try:
            self.files.write(files)
        except MetadataFileError as err:
            raise DeviceMetadataError(
                str(ref), f"cannot write device metadata {err.path}: {err.why}") from err
        log.debug("wrote device metadata", extra={"claim": ref.uid, "files": len(files)})

    def paths(self, record: ClaimRecord) -> list[Path]:
        if record.metadata is None or self.files is None:
            return []
        return [host_path(self.files.root, record.namespace, record.name, r)
                for r in record.metadata.requests]

    def missing(self, record: ClaimRecord) -> bool:
        """A file the record lists is not there (or is not a regular file any more)."""
        files = self.files
        return files is not None and any(not files.present(p) for p in self.paths(record))

    def remove(self, record: ClaimRecord) -> None:
        """Remove the record's files; ``DeviceMetadataError`` when one cannot be removed."""
        if record.metadata is None or self.files is None:
            return
        try:
            self.files.remove(claim_dir(self.files.root, record.namespace, record.name).name,
                              record.metadata.requests)
        except MetadataFileError as err:
            raise DeviceMetadataError(
                f"{record.namespace}/{record.name} ({record.uid})",
                f"cannot remove device metadata {err.path}: {err.why}") from err

    def remove_unrecorded(self, ref: ClaimRef, claims: Mapping[str, ClaimRecord]) -> None:
        """Remove every file under the claim's name, as the helper's clean-up does, unless
        another record has files there (a claim of the same name, prepared: ``check_unshared``
        kept the two apart). A name no claim can have is no path of ours: nothing happens."""
        if self.files is None or name_problem(ref.namespace, ref.name) is not None:
            return
        for other in claims.values():
            if other.uid != ref.uid and other.metadata is not None and (
                    other.namespace, other.name) == (ref.namespace, ref.name):
                return
        name = claim_dir(self.files.root, ref.namespace, ref.name).name
        requests = self.files.requests(name)
        if requests is None:  # no directory of the claim's: the usual unprepare, metadata off
            return
        try:
            self.files.remove(name, requests)
        except MetadataFileError as err:
            raise DeviceMetadataError(
                str(ref), f"cannot remove device metadata {err.path}: {err.why}") from err

    def sweep(self, records: Mapping[str, ClaimRecord]) -> tuple[str, ...]:
        """Remove files that no record lists; their ``<namespace>_<name>/<request>`` dirs.

        Never fatal: start-up goes on, and what stays is logged.
        """
        if self.files is None:
            return ()
        known = {(r.namespace, r.name, q) for r in records.values() if r.metadata is not None
                 for q in r.metadata.requests}
        removed: list[str] = []
        for namespace, name, request in sorted(self.files.on_disk() - known):
            where = f"{namespace}_{name}/{request}"
            try:
                self.files.remove(f"{namespace}_{name}", (request,))
            except MetadataFileError as err:
                log.error("cannot remove device metadata no claim explains",
                          extra={"path": str(err.path), "error": err.why})
                continue
            removed.append(where)
        return tuple(removed)
