"""Whether the API server keeps list-valued device attributes (DRAListTypeAttributes).

Kubernetes 1.37 lets ``resource.kubernetes.io/numaNode`` be an int list, behind a feature
gate that is off by default. Nothing in API discovery says whether it is on: the 1.37 schema
has ``ints`` either way, and with the gate off the server drops the field silently, which
leaves a value-less attribute that it then refuses (422). So the controller asks once per
start, before the first sync of resources that have a list form (``list_pools``): a
server-side dry-run create (``?dryRun=All``, nothing is stored, no watch event) of a minimal
ResourceSlice carrying one list attribute, and reads what comes back.

* the list came back: lists are taken, the list form is published;
* it was dropped, or the object refused as invalid (422): the scalar form;
* anything else (no answer, 403, 500, an answer that is not a ResourceSlice): the scalar
  form too, the form every server takes, with one line saying why.

The operator can skip the probe (``--numa-node-attribute list|scalar``, agent/common/config.py;
``auto`` probes): the controller's ``list_attributes`` True/False instead of None.

The probe looks like one of our slices (our driver, the node's pool and nodeName) so that the
node authorizer and the admission policy in deploy/ judge it as they judge the real ones.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from agent.slices.api import ApiError
from agent.slices.owner import Owner
from agent.slices.versions import api_version
from discovery.model import NUMA_NODE, DriverResources

log = logging.getLogger("agent.slices")

PROBE_DEVICE = "list-attribute-probe"
PROBE_VALUE = [0]
PROBE_FAILED = "list attribute probe failed: numaNode published as int until the agent restarts"


@runtime_checkable
class DryRunClient(Protocol):
    """A SliceClient that can also create without storing (KubeSliceClient can)."""

    def dry_run_create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...


def probe_object(driver: str, owner: Owner | None, version: str) -> dict[str, Any]:
    """The smallest ResourceSlice with one list attribute that our own slices' rules allow."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": owner.name if owner is not None else PROBE_DEVICE,
                 "generation": 0, "resourceSliceCount": 1},
        "devices": [{"name": PROBE_DEVICE,
                     "attributes": {NUMA_NODE: {"ints": list(PROBE_VALUE)}}}],
    }
    if owner is not None and owner.is_node:
        spec["nodeName"] = owner.name
    else:
        spec["allNodes"] = True
    prefix = f"{driver}-{owner.name}-" if owner is not None else f"{driver}-"
    return {"apiVersion": api_version(version), "kind": "ResourceSlice",
            "metadata": {"generateName": f"probe-{prefix}"[:200]}, "spec": spec}


def _kept(answer: Any) -> bool | None:
    """True: the list came back; False: the attribute lost it; None: not a ResourceSlice."""
    try:
        device = answer["spec"]["devices"][0]
        attr = device["attributes"].get(NUMA_NODE)
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if not isinstance(attr, Mapping):
        return False
    return attr.get("ints") == PROBE_VALUE


def server_takes_lists(client: Any, driver: str, owner: Owner | None, version: str) -> bool:
    """Ask ``client`` once whether list attributes survive a create; False when unsure."""
    fields = {"api_version": version, "driver": driver}
    if not isinstance(client, DryRunClient):
        log.info("list attributes not probed (client cannot dry-run): numaNode published as "
                 "int", extra=fields)
        return False
    try:
        answer = client.dry_run_create(version, probe_object(driver, owner, version))
    except ApiError as err:
        # A 422 about the attribute is the gate's answer; one about anything else (an
        # admission policy, a name) still means scalar, but is worth a warning.
        if err.invalid and (not err.causes or any(NUMA_NODE in c.field for c in err.causes)):
            log.info("API server refuses list attributes (DRAListTypeAttributes off): "
                     "numaNode published as int", extra={**fields, "status": err.status})
        else:
            why = err.unreachable or f"{err.reason}: {err.message}"[:200]
            log.warning(PROBE_FAILED,
                        extra={**fields, "status": err.status, "error": why})
        return False
    except Exception as err:  # a probe must never stop publishing; the scalar always works
        log.warning(PROBE_FAILED,
                    extra={**fields, "error": f"{type(err).__name__}: {err}"[:200]})
        return False
    kept = _kept(answer)
    if kept is None:
        log.warning(PROBE_FAILED,
                    extra={**fields, "error": "the answer is not a ResourceSlice"})
        return False
    if not kept:
        log.info("API server drops list attributes (DRAListTypeAttributes off): numaNode "
                 "published as int", extra=fields)
        return False
    log.info("API server keeps list attributes: numaNode published as an int list",
             extra=fields)
    return True


class ListForm:
    """The controller's answer: lists or scalars, chosen by the operator or probed once."""

    def __init__(self, lists: bool | None) -> None:
        self._lock = threading.Lock()
        self._lists = lists
        self._probe = lists is None

    @property
    def lists(self) -> bool | None:
        with self._lock:
            return self._lists

    def undecided(self, resources: DriverResources | None) -> bool:
        """Whether a probe is due: only once ``resources`` offer a list form at all, so a
        driver without list attributes never sends one."""
        with self._lock:
            return self._probe and resources is not None and resources.list_pools is not None

    def decide(self, client: Any, driver: str, owner: Owner | None, version: str) -> bool:
        """Probe if still undecided; True when that changed the answer (re-form the pools)."""
        with self._lock:
            if not self._probe:
                return False
            self._probe = False
        lists = server_takes_lists(client, driver, owner, version)
        with self._lock:
            self._lists = lists
        return lists

    def apply(self, resources: DriverResources | None) -> DriverResources | None:
        """``resources`` in the form decided (the scalar one while undecided)."""
        if resources is None:
            return None
        return resources.in_form(bool(self.lists))
