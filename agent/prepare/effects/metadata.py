"""Device metadata files (KEP-5304, ``--device-metadata``) as an effect.

``ClaimMetadata`` (``agent.prepare.claimmetadata``) knows the files; this module says when
each step happens: planned before the record (a name that cannot be a path segment fails the
claim then), written before the spec (the spec never names a file that is not there), written
again with the spec after a reboot or a lost file, removed at unprepare and rollback, and at
start-up the files no record explains go, unless the checkpoint was corrupt (then, like spec
files, they are the best evidence there is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import cast

from agent.checkpoint.model import ClaimRecord
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.effects.base import BaseEffect, Reconciled, Release, Step
from agent.prepare.metadata import MetadataFile


class MetadataEffect(BaseEffect):
    name = "metadata"
    manual_fix = "remove the claim's files under the plugin's metadata directory by hand"

    def __init__(self, metadata: ClaimMetadata) -> None:
        self.metadata = metadata

    def touches(self, record: ClaimRecord) -> bool:
        return record.metadata is not None

    def plan(self, step: Step) -> None:
        # A rewrite keeps a claim prepared without files so; with the feature switched off
        # since, the files it had go once the spec no longer names them (``reapply``).
        wanted = not step.rewrite or step.record.metadata is not None
        files, step.devices, record = self.metadata.plan(step.claim, step.results,
                                                         step.devices, wanted=wanted)
        step.planned[self.name] = (files, step.record)
        step.record = replace(step.record, metadata=record)

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None:
        if step.record.metadata is not None:
            self.metadata.check_unshared(step.ref, claims)

    def _files(self, step: Step) -> tuple[Sequence[MetadataFile], ClaimRecord]:
        """The files ``plan`` chose, and the record as it was before."""
        planned = step.planned.get(self.name)
        if planned is None:
            return (), step.record
        return cast("tuple[Sequence[MetadataFile], ClaimRecord]", planned)

    def apply(self, step: Step) -> None:
        files, _ = self._files(step)
        self.metadata.write(step.ref, files)

    def reapply(self, step: Step) -> None:
        files, before = self._files(step)
        self.metadata.write(step.ref, files)
        if step.record.metadata is None and before.metadata is not None:
            self.metadata.remove(before)

    def stale(self, record: ClaimRecord) -> bool:
        return self.metadata.missing(record)

    def release(self, how: Release) -> None:
        """The record's files; with none recorded (a record adopted from a spec after a
        corrupt checkpoint, or none at all), those under the kubelet's claim name."""
        if how.record is not None and how.record.metadata is not None:
            self.metadata.remove(how.record)
        elif how.ref is not None:
            self.metadata.remove_unrecorded(how.ref, how.remaining())

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        return Reconciled(removed=() if corrupt else self.metadata.sweep(claims))
