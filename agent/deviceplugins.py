"""Device plugins that already serve what our DeviceClasses offer as extended resources.

Since 1.37 (KEP-5004, GA) a DeviceClass may name an ``extendedResourceName``: a pod asking for
``nvidia.com/gpu: 1`` in its limits then gets a device of that class through a claim the
scheduler writes itself. On a node where a device plugin still advertises the same name, the
scheduler lets the device plugin serve such pods (the node's allocatable has the resource)
while claims are served from our slices: the same GPUs handed out twice. So the agent refuses
to start there, naming the resource and where the device plugin was seen, unless the operator
says the overlap is intended (``dra-agent run --allow-device-plugin-overlap``).

Where a device plugin is seen: the Node's ``status.capacity`` (any non-zero extended resource:
only device plugins and operators' manual patches put them there), and the kubelet's
device-plugin checkpoint (``<kubelet-dir>/device-plugins/kubelet_internal_checkpoint``, whose
``Data.RegisteredDevices`` maps each plugin's resource name to its device IDs), which is all
there is to read when the agent runs without an API server.

A class counts only when it selects devices this node publishes: its selectors are evaluated
against our slices by the allocator of ``dra-agent explain`` (the scheduler's CEL, so a class of
another driver, or our gpu class on a node started with ``--device-types nic``, is no overlap).
The caller hands that evaluator in (``SelectorCheck``; the daemon passes
``agent.explain.probe.selects_a_device``): this module, which doctor loads too, stays below
explain and never loads the allocator or its CEL engine itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agent.common.quantity import QuantityError, parse_quantity
from agent.common.safefile import UnsafeFileError, read_capped
from agent.kube.errors import KubeAPIError
from agent.kube.transport import KubeHTTP

log = logging.getLogger(__name__)

CHECKPOINT = Path("device-plugins") / "kubelet_internal_checkpoint"
#: The kubelet's checkpoint holds device IDs per pod: a few hundred KiB on the largest nodes.
MAX_CHECKPOINT_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Overlap:
    resource: str
    device_class: str
    #: Where the device plugin was seen: "Node n1 status.capacity" or the checkpoint's path.
    seen_in: str

    def message(self) -> str:
        return (
            f"a device plugin already advertises {self.resource} on this node ({self.seen_in}), "
            f"and DeviceClass {self.device_class} maps {self.resource} to devices this agent "
            "publishes, so they would be handed out twice: stop that device plugin on this node "
            "(or remove extendedResourceName from the class), or start with "
            "--allow-device-plugin-overlap if both are meant to run"
        )


def is_extended_resource(name: str) -> bool:
    """apimachinery's IsExtendedResourceName: qualified, outside kubernetes.io, not quota's
    ``requests.`` form."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def advertised_in_capacity(node: Mapping[str, Any]) -> dict[str, str]:
    """Extended resources with a non-zero capacity on the Node -> where they were seen."""
    name = (node.get("metadata") or {}).get("name", "?")
    capacity = (node.get("status") or {}).get("capacity") or {}
    out: dict[str, str] = {}
    if not isinstance(capacity, Mapping):
        return out
    for resource, value in capacity.items():
        if not isinstance(resource, str) or not is_extended_resource(resource):
            continue
        try:
            if parse_quantity(value) <= 0:
                continue  # a device plugin that stopped leaves its resource at 0
        except (QuantityError, TypeError, ValueError):
            continue
        out[resource] = f"Node {name} status.capacity"
    return out


def advertised_in_checkpoint(kubelet_dir: Path) -> dict[str, str]:
    """Resource names the kubelet's device-plugin checkpoint has registered devices for.

    The file is the kubelet's, not ours: one that cannot be read or parsed is logged once and
    read as naming nothing (it must not keep the agent from starting), and never followed if
    it is a symlink, a FIFO or a device.
    """
    path = kubelet_dir / CHECKPOINT
    try:
        data = read_capped(path, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, UnsafeFileError) as err:
        log.warning("device-plugin checkpoint not read", extra={"path": str(path),
                                                                "error": str(err)})
        return {}
    try:
        doc = json.loads(data)
        registered = doc["Data"]["RegisteredDevices"] or {}
        if not isinstance(registered, Mapping):
            raise TypeError("RegisteredDevices is not an object")
    except (ValueError, KeyError, TypeError) as err:
        log.warning("device-plugin checkpoint not understood",
                    extra={"path": str(path), "error": f"{type(err).__name__}: {err}"})
        return {}
    return {
        str(resource): str(path)
        for resource, devices in registered.items()
        if isinstance(resource, str) and is_extended_resource(resource) and devices
    }


def mapped_classes(classes: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """extendedResourceName -> the DeviceClasses naming it (by name, sorted)."""
    out: dict[str, list[str]] = {}
    for cls in classes:
        resource = (cls.get("spec") or {}).get("extendedResourceName")
        name = (cls.get("metadata") or {}).get("name")
        if isinstance(resource, str) and resource and isinstance(name, str):
            out.setdefault(resource, []).append(name)
    return {r: sorted(names) for r, names in out.items()}


def find_overlaps(
    classes: Sequence[Mapping[str, Any]],
    advertised: Mapping[str, str],
    selects_ours: Callable[[Mapping[str, Any]], bool],
) -> list[Overlap]:
    """Each (resource, class) a device plugin advertises and whose class selects our devices.

    ``selects_ours`` is only asked about classes whose resource is advertised, so the usual
    node (no device plugin, or none for these names) never evaluates a selector.
    """
    by_name = {(c.get("metadata") or {}).get("name"): c for c in classes}
    out = []
    for resource, names in sorted(mapped_classes(classes).items()):
        if resource not in advertised:
            continue
        out += [Overlap(resource, name, advertised[resource]) for name in names
                if selects_ours(by_name[name])]
    return out


#: Whether a DeviceClass's selectors pass one device of the slices on the node (the class, the
#: slices, the node's name); raises ValueError for a class whose selectors do not compile.
SelectorCheck = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], str], bool]


def class_selects(slices: Sequence[Mapping[str, Any]], node_name: str, check: SelectorCheck,
                  ) -> Callable[[Mapping[str, Any]], bool]:
    """Whether one device of ``slices`` passes a class's selectors, as ``check`` says.

    A class whose selectors do not compile (the API server would have refused it) selects
    nothing here: it cannot allocate anything either.
    """

    def selects(device_class: Mapping[str, Any]) -> bool:
        name = (device_class.get("metadata") or {}).get("name")
        try:
            return check(device_class, slices, node_name)
        except ValueError as err:
            log.warning("DeviceClass not evaluated for device-plugin overlap",
                        extra={"device_class": name, "error": str(err)})
            return False

    return selects


def read_node(api: KubeHTTP, node_name: str) -> Mapping[str, Any] | None:
    """The Node object; None (and one log line) when it cannot be read: the check must not
    keep a node from starting because the API server is slow."""
    try:
        node = api.request("GET", f"/api/v1/nodes/{quote(node_name, safe='')}",
                           timeout=10.0).raise_for_status().json()
    except KubeAPIError as err:
        log.warning("device-plugin overlap: Node not read, the kubelet's checkpoint alone "
                    "tells", extra={"node": node_name, "error": str(err)})
        return None
    return node if isinstance(node, Mapping) else None


def node_capacity(api: KubeHTTP, node_name: str) -> dict[str, str]:
    """The extended resources the Node advertises; {} when it cannot be read."""
    node = read_node(api, node_name)
    return advertised_in_capacity(node) if node is not None else {}


def cluster_classes(
    api: KubeHTTP, fallback: Callable[[], list[Mapping[str, Any]]],
) -> list[Mapping[str, Any]]:
    """The cluster's DeviceClasses, or ``fallback()`` (the shipped ones) with one log line when
    they cannot be listed: the kubelet's own credentials (bare metal) may not list them."""
    for version in ("v1", "v1beta2", "v1beta1"):
        try:
            listed = api.request("GET", f"/apis/resource.k8s.io/{version}/deviceclasses",
                                 timeout=10.0).raise_for_status().json()
        except KubeAPIError as err:
            if err.not_found:
                continue  # that version is not served: the next one
            log.warning("device-plugin overlap: DeviceClasses not listed, the shipped ones "
                        "stand in", extra={"error": str(err)})
            break
        items = listed.get("items") if isinstance(listed, Mapping) else None
        return [i for i in items or [] if isinstance(i, Mapping)]
    return fallback()
