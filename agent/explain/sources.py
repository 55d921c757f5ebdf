"""Where the slices, classes and other claims come from: files, this node's discovery, or the
API server (read-only GETs of resource.k8s.io/v1)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.explain.docs import InputError

API = "/apis/resource.k8s.io/v1"


def slices_from_discovery(cfg: Config) -> list[dict[str, Any]]:
    """What this node (or ``--simulate PROFILE``) would publish, as ResourceSlice dicts."""
    try:
        from agent.commands.discover import run_discovery, slice_objects
        from discovery.pools import build_resources
        from discovery.simulate import ProfileError
    except ImportError as err:  # discovery not installed in this build
        raise InputError("--slices from-discovery", f"discovery is unavailable: {err}") from err
    with tempfile.TemporaryDirectory(prefix="dra-agent-explain-") as tmp:
        try:
            inventory = run_discovery(cfg, Path(tmp))
        except ProfileError as err:
            raise InputError("--simulate", str(err)) from err
    resources = build_resources(inventory, cfg.node_name)
    return slice_objects(resources, cfg.driver_name, cfg.node_name)


class Cluster:
    """Read-only access to the node's slices, the classes and the allocated claims."""

    def __init__(self, cfg: Config) -> None:
        from agent.kube import KubeConfigError, api_client

        try:
            api = api_client(cfg)
        except KubeConfigError as err:
            raise InputError("--kubeconfig", str(err)) from err
        if api is None:
            raise InputError("--slices from-cluster", "needs an API server (--kubeconfig is none)")
        self._api: Any = api
        self._node = cfg.node_name

    def _list(self, path: str, field_selector: str | None = None) -> list[dict[str, Any]]:
        """A raw JSON list (plain dicts: the typed models drop fields they do not know)."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        try:
            method, url, headers, body, post = self._api.param_serialize(
                "GET", path, query_params=query, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"])
            response = self._api.call_api(method, url, header_params=headers, body=body,
                                          post_params=post, _request_timeout=30)
            raw = response.response
            status, payload = response.status, raw.data
        except Exception as err:  # urllib3/socket errors: report, don't trace
            raise InputError(path, f"cannot list: {err}") from err
        if not 200 <= status < 300:
            raise InputError(path, f"cannot list: HTTP {status}: {payload[:200]!r}")
        try:
            data = json.loads(payload)
        except ValueError as err:
            raise InputError(path, f"cannot list: the answer is not JSON ({err})") from err
        items = data.get("items") if isinstance(data, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    def slices(self) -> list[dict[str, Any]]:
        return self._list(f"{API}/resourceslices", f"spec.nodeName={self._node}")

    def classes(self) -> list[dict[str, Any]]:
        return self._list(f"{API}/deviceclasses")

    def allocated_claims(self) -> list[dict[str, Any]]:
        return [c for c in self._list(f"{API}/resourceclaims")
                if (c.get("status") or {}).get("allocation")]
