"""The kubelet's DRA manager per pod, on top of the stand-in's gRPC calls.

What tests/realk8s/test_kubelet_dra.py saw the real manager (pkg/kubelet/cm/dra) do, and
:class:`PodClaims` does too: it resolves each of the pod's claims (a template claim by the
name in ``status.resourceClaimStatuses``), GETs it, and refuses before any plugin call when
the claim is not allocated, not reserved for the pod, not owned by the pod (template claims),
or its driver is not registered; it sends every claim of the pod not yet prepared, one call
per driver; the first per-claim error fails the whole pod, and nothing of it counts as
prepared, so the kubelet's retry sends everything again; a claim shared by pods is prepared
once and unprepared with its last pod. README.md lists the behaviours and what is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.kubelet.standin import KubeletStandIn
from tests.fakes.kubelet.types import ClaimRef, KubeletError, PluginCallError, PreparedDevice

#: (namespace, name) -> the claim as the API server returns it; raises on failure (the
#: message becomes the pod's error). The narrow seam to whichever API server a test runs.
ClaimGetter = Callable[[str, str], Mapping[str, Any]]


class PodError(KubeletError):
    """The pod's prepare or unprepare failed; the message is what the kubelet says."""


@dataclass
class _Claim:
    """The manager's claim cache entry (ClaimInfo)."""

    ref: ClaimRef
    drivers: tuple[str, ...]
    pods: set[str] = field(default_factory=set)
    prepared: bool = False
    unpreparing: bool = False
    devices: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)


class PodClaims:
    """Prepare and unprepare whole pods as the kubelet does (see the module docstring)."""

    def __init__(self, kubelet: KubeletStandIn, get_claim: ClaimGetter) -> None:
        self.kubelet = kubelet
        self.get_claim = get_claim
        self._cache: dict[tuple[str, str], _Claim] = {}

    def prepare(self, pod: Mapping[str, Any]) -> None:
        """Raises :class:`PodError` (or what the stand-in raises for a bad answer)."""
        meta = pod["metadata"]
        namespace, pod_uid = meta["namespace"], meta["uid"]
        found: list[_Claim] = []
        # Everything is checked before the cache changes or any plugin is called.
        for pod_claim in pod["spec"].get("resourceClaims") or []:
            name, templated = _claim_name(pod, pod_claim)
            if name is None:
                continue
            try:
                claim = self.get_claim(namespace, name)
            except Exception as err:  # whatever the API client raises: the pod fails on it
                raise PodError(f"fetch ResourceClaim {name}: {err}") from err
            cmeta, uid = claim["metadata"], claim["metadata"]["uid"]
            if templated and not any(o.get("controller") and o.get("uid") == pod_uid
                                     for o in cmeta.get("ownerReferences") or []):
                raise PodError(f"ResourceClaim {namespace}/{name} was not created for Pod "
                               f"{namespace}/{meta['name']} (Pod is not owner)")
            status = claim.get("status") or {}
            if not any(r.get("uid") == pod_uid for r in status.get("reservedFor") or []):
                raise PodError(f"pod {meta['name']} ({pod_uid}) is not allowed to use "
                               f"ResourceClaim {name} ({uid})")
            allocation = status.get("allocation")
            if not allocation:
                raise PodError(f"ResourceClaim {name}: not allocated")
            drivers = tuple(sorted({r["driver"] for r in
                                    (allocation.get("devices") or {}).get("results") or []}))
            for driver in drivers:
                if self.kubelet.registered(driver) is None:
                    raise PodError(f"DRA driver {driver} is not registered")
            found.append(_Claim(ClaimRef(namespace, name, uid), drivers))

        batches: dict[str, list[ClaimRef]] = {}
        pending: list[_Claim] = []
        for new in found:
            key = (namespace, new.ref.name)
            entry = self._cache.setdefault(key, new)
            if entry.ref.uid != new.ref.uid:
                raise PodError(f"old ResourceClaim with same name {new.ref.name} and different "
                               f"UID {entry.ref.uid} still exists (previous pod force-deleted?!)")
            if entry.unpreparing:
                raise PodError(f"ResourceClaim {new.ref.name} is being unprepared")
            entry.pods.add(pod_uid)
            if entry.prepared:
                continue
            pending.append(entry)
            for driver in entry.drivers:
                batches.setdefault(driver, []).append(entry.ref)

        for driver, refs in batches.items():
            try:
                results = self.kubelet.prepare(driver, refs)
            except PluginCallError as err:
                raise PodError(f"NodePrepareResources: {err}") from err
            for ref in refs:
                result = results[ref.uid]
                if result.error:
                    raise PodError(f"NodePrepareResources failed for ResourceClaim {ref.name}: "
                                   f"{result.error}")
                # The driver's answer replaces what an earlier, failed attempt left.
                self._cache[(namespace, ref.name)].devices[driver] = result.devices
        for entry in pending:  # only once every batch succeeded
            entry.prepared = True

    def unprepare(self, pod: Mapping[str, Any]) -> None:
        """Unprepares the pod's claims no other pod still uses; raises :class:`PodError`."""
        pod_uid = pod["metadata"]["uid"]
        last: list[_Claim] = []
        for entry in [e for e in self._cache.values() if pod_uid in e.pods]:
            if len(entry.pods) > 1:
                entry.pods.discard(pod_uid)
            else:
                entry.unpreparing = True
                last.append(entry)
        for driver in sorted({d for e in last for d in e.drivers}):
            refs = [e.ref for e in last if driver in e.drivers]
            try:
                results = self.kubelet.unprepare(driver, refs)
            except PluginCallError as err:
                raise PodError(f"NodeUnprepareResources: {err}") from err
            for ref in refs:
                if results[ref.uid].error:
                    raise PodError(f"NodeUnprepareResources failed for ResourceClaim "
                                   f"{ref.name}: {results[ref.uid].error}")
        for entry in last:
            del self._cache[(entry.ref.namespace, entry.ref.name)]

    def prepared(self) -> dict[str, set[str]]:
        """claim UID -> the UIDs of the pods using it, for the claims prepared."""
        return {e.ref.uid: set(e.pods) for e in self._cache.values() if e.prepared}

    def cdi_ids(self, pod: Mapping[str, Any], container: str) -> list[str]:
        """The CDI IDs of the container's claims (GetResources): each listed once."""
        spec = pod["spec"]
        (wanted,) = [c for c in spec["containers"] if c["name"] == container]
        by_pod_claim = {pc["name"]: pc for pc in spec.get("resourceClaims") or []}
        ids: list[str] = []
        for use in (wanted.get("resources") or {}).get("claims") or []:
            name, _ = _claim_name(pod, by_pod_claim[use["name"]])
            entry = self._cache.get((pod["metadata"]["namespace"], name or ""))
            if entry is None or not entry.prepared:
                raise PodError(f"unable to get information for ResourceClaim {name}")
            request = use.get("request", "")
            for devices in entry.devices.values():
                for device in devices:
                    # A container naming a request gets that request's devices only.
                    if request and device.request_names and request.split("/")[0] not in [
                            r.split("/")[0] for r in device.request_names]:
                        continue
                    ids.extend(i for i in device.cdi_device_ids if i not in ids)
        return ids


def _claim_name(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> tuple[str | None, bool]:
    """resourceclaim.Name: the claim's name (None: nothing to prepare) and whether it came
    from a template (then the pod must own it)."""
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"]), False
    if pod_claim.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("name") == pod_claim["name"]:
                name = status.get("resourceClaimName")
                return (str(name) if name else None), True
        meta = pod["metadata"]
        raise PodError(f'pod "{meta["namespace"]}/{meta["name"]}": '
                       "ResourceClaim not created yet")
    raise PodError(f'pod "{pod["metadata"]["name"]}", spec.resourceClaim '
                   f'{pod_claim.get("name")!r}: none of the supported fields are set')
