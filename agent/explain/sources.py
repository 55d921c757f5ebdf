"""Where the slices, classes and other claims come from: files, this node's discovery, or the
API server (read-only GETs of resource.k8s.io/v1)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from agent.common.config import Config
from agent.explain.docs import InputError
from agent.kube.errors import KubeAPIError
from agent.kube.transport import KubeHTTP

API = "/apis/resource.k8s.io/v1"


def slices_from_discovery(cfg: Config, list_attributes: bool = False) -> list[dict[str, Any]]:
    """What this node (or ``--simulate PROFILE``) would publish, as ResourceSlice dicts, with
    numaNode as an int list where ``list_attributes`` (the cluster's DRAListTypeAttributes)."""
    try:
        # Lazy: only from-discovery scans this node; files and from-cluster load no discovery.
        from agent.inventory import run_discovery, slice_objects
        from discovery.pools import build_resources
        from discovery.simulate import ProfileError
    except ImportError as err:  # discovery not installed in this build
        raise InputError("--slices from-discovery", f"discovery is unavailable: {err}") from err
    try:
        inventory = run_discovery(cfg)
    except ProfileError as err:
        raise InputError("--simulate", str(err)) from err
    resources = build_resources(inventory, cfg.node_name).in_form(list_attributes)
    return slice_objects(resources, cfg.driver_name, cfg.node_name)


class Cluster:
    """Read-only access to the node's slices, the classes and the allocated claims."""

    def __init__(self, cfg: Config) -> None:
        # Lazy: the kubeconfig readers load only where explain asks the API server.
        from agent.kube.client import KubeConfigError, api_client

        try:
            api = api_client(cfg)
        except KubeConfigError as err:
            raise InputError("--kubeconfig", str(err)) from err
        if api is None:
            raise InputError("--slices from-cluster", "needs an API server (--kubeconfig is none)")
        self._api: KubeHTTP = api
        self._node = cfg.node_name

    def _list(self, path: str, field_selector: str | None = None) -> list[dict[str, Any]]:
        """A raw JSON list (plain dicts: the typed models drop fields they do not know)."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        try:
            response = self._api.request("GET", path, query=query, timeout=30.0)
        except KubeAPIError as err:  # no HTTP answer: report, don't trace
            raise InputError(path, f"cannot list: {err.reason}: {err.message}") from err
        if not response.ok:
            raise InputError(path, f"cannot list: HTTP {response.status}: {response.body[:200]!r}")
        try:
            data = json.loads(response.body)
        except ValueError as err:
            raise InputError(path, f"cannot list: the answer is not JSON ({err})") from err
        items = data.get("items") if isinstance(data, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    def slices(self) -> list[dict[str, Any]]:
        """All slices: those selected by nodeSelector or allNodes count for this node too, and
        other nodes' slices decide whether an incomplete pool is obsolete."""
        return self._list(f"{API}/resourceslices")

    def node_labels(self) -> dict[str, str]:
        path = f"/api/v1/nodes/{quote(self._node, safe='')}"
        try:
            response = self._api.request("GET", path, timeout=30.0)
        except KubeAPIError as err:
            raise InputError(path, f"cannot get: {err.reason}: {err.message}") from err
        if response.status == 404:
            return {}  # no Node object (yet): only the hostname label is assumed
        if not response.ok:
            raise InputError(path, f"cannot get: HTTP {response.status} (use --node-labels)")
        try:
            labels = (json.loads(response.body).get("metadata") or {}).get("labels") or {}
        except (ValueError, AttributeError) as err:
            raise InputError(path, f"cannot get: the answer is not a Node ({err})") from err
        return {str(k): str(v) for k, v in labels.items()}

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One namespaced resource.k8s.io/v1 object (a Pod's claim or template); None: absent."""
        path = f"{API}/namespaces/{quote(namespace, safe='')}/{plural}/{quote(name, safe='')}"
        try:
            response = self._api.request("GET", path, timeout=30.0)
        except KubeAPIError as err:
            raise InputError(path, f"cannot get: {err.reason}: {err.message}") from err
        if response.status == 404:
            return None
        if not response.ok:
            raise InputError(path, f"cannot get: HTTP {response.status}: {response.body[:200]!r}")
        try:
            obj = json.loads(response.body)
        except ValueError as err:
            raise InputError(path, f"cannot get: the answer is not JSON ({err})") from err
        if not isinstance(obj, dict):
            raise InputError(path, "cannot get: the answer is not an object")
        return obj

    def classes(self) -> list[dict[str, Any]]:
        return self._list(f"{API}/deviceclasses")

    def allocated_claims(self) -> list[dict[str, Any]]:
        return [c for c in self._list(f"{API}/resourceclaims")
                if (c.get("status") or {}).get("allocation")]
