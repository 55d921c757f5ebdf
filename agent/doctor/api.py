"""The API server: reachable, resource.k8s.io served, this node's slices, the DeviceClasses and
the agent's permissions. Every request has a short timeout; a failure is that check's answer.

Without a client (``--kubeconfig none``, no credentials found) every check here is skipped with
the reason, so a node is diagnosed the same with or without cluster access.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from agent.doctor.context import API_TIMEOUT, Context, Http
from agent.doctor.host import one_line, table
from agent.doctor.model import Check, fail, ok, skipped, warn

#: agent.slices.versions' GROUP (a test keeps them equal): importing agent.slices here would
#: load the whole slice controller, a third of the doctor's run time, for a string.
GROUP = "resource.k8s.io"

REACHABLE, VERSIONS, SLICES, CLASSES, RBAC = ("API server", "resource.k8s.io API",
                                              "ResourceSlices", "DeviceClasses", "RBAC")
#: What deploy/base/rbac.yaml grants, as (group, resource, subresource, verb, what the agent
#: loses without it: "" when it cannot work without it); tests/doctor keeps the two the same.
#: Without an optional one the agent says so once and carries on, so its denial is a warning.
PERMISSIONS: tuple[tuple[str, str, str, str, str], ...] = (
    *((GROUP, "resourceslices", "", v, "")
      for v in ("get", "list", "watch", "create", "update", "delete")),
    (GROUP, "resourceclaims", "", "get", ""),
    (GROUP, "resourceclaims", "status", "patch", "NIC details in claim status"),
    ("", "nodes", "", "get", ""),
    (GROUP, "deviceclasses", "", "list",
     "the cluster's classes in the device-plugin overlap check (the shipped ones stand in)"),
)


class ApiCheckError(Exception):
    """One request that did not give an answer the check can use; the message is one line,
    ``status`` the HTTP status (0: no answer, or one that is not JSON)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _get(http: Http, path: str, query: list[tuple[str, str]] | None = None) -> Any:
    return _call(http, "GET", path, query=query)


def _call(http: Http, method: str, path: str, **kw: Any) -> Any:
    try:
        resp = http.request(method, path, timeout=API_TIMEOUT, **kw)
        return resp.raise_for_status().json()
    except Exception as err:  # no answer, an error status, or a body that is not JSON
        status = getattr(err, "status", 0)
        raise ApiCheckError(one_line(str(err)), status if isinstance(status, int) else 0) \
            from err


def _served(http: Http) -> list[str]:
    try:
        doc = _get(http, f"/apis/{GROUP}")
    except ApiCheckError as err:
        if err.status == 404:
            return []
        raise
    versions = doc.get("versions") if isinstance(doc, dict) else None
    return [str(v["version"]) for v in versions or [] if isinstance(v, dict) and "version" in v]


def _version(http: Http) -> str | None:
    """The slice version the agent would use, or None when the server serves none of them."""
    from agent.slices.versions import PREFERRED_VERSIONS

    served = _served(http)
    return next((v for v in PREFERRED_VERSIONS if v in served), None)


def _no_api(ctx: Context, name: str) -> Check | None:
    why = ctx.unreachable()
    return skipped(name, why) if why else None


def check_reachable(ctx: Context) -> Check:
    if ctx.api is None and ctx.api_error:
        return warn(REACHABLE, ctx.api_error, "fix the kubeconfig or the ServiceAccount mount "
                    "(the agent itself cannot use it either)")
    if ctx.api is None:
        return skipped(REACHABLE, ctx.api_skip)
    doc, why = ctx.server_version()
    if doc is None:
        return warn(REACHABLE, f"{ctx.api.server}: {why}",
                    "check the kubeconfig's server, the network and the API server's health")
    return ok(REACHABLE, f"{ctx.api.server}: Kubernetes {doc.get('gitVersion', '?')}")


def check_versions(ctx: Context) -> Check:
    if (skip := _no_api(ctx, VERSIONS)) is not None:
        return skip
    assert ctx.api is not None
    from agent.slices.versions import PREFERRED_VERSIONS

    try:
        served = _served(ctx.api)
    except ApiCheckError as err:
        return warn(VERSIONS, str(err), "see API server")
    usable = [v for v in PREFERRED_VERSIONS if v in served]
    if not usable:
        return fail(VERSIONS, f"served: {', '.join(served) or 'none'}; the agent needs one of "
                    f"{', '.join(PREFERRED_VERSIONS)}",
                    "upgrade to Kubernetes 1.34 (DRA GA), or enable DynamicResourceAllocation "
                    "and --runtime-config=resource.k8s.io/v1beta1=true on 1.32/1.33")
    return ok(VERSIONS, f"served: {', '.join(served)}; the agent uses {usable[0]}")


def _slices(http: Http, version: str, selector: str) -> list[dict[str, Any]]:
    """This node's slices in v1 shape (agent.slices.versions converts older versions)."""
    from agent.slices.versions import from_wire

    items: list[dict[str, Any]] = []
    cont = ""
    for _ in range(100):  # 100 pages of 500: more than any node publishes
        query = [("fieldSelector", selector), ("limit", "500")] + (
            [("continue", cont)] if cont else [])
        doc = _get(http, f"/apis/{GROUP}/{version}/resourceslices", query)
        if not isinstance(doc, dict):
            raise ApiCheckError("the ResourceSlice list is not a JSON object")
        items += [from_wire(o, version) for o in doc.get("items") or [] if isinstance(o, dict)]
        cont = (doc.get("metadata") or {}).get("continue") or ""
        if not cont:
            break
    return items


def published_devices(slices: Sequence[dict[str, Any]]) -> int:
    """Devices in the newest generation of each pool: while the agent replaces a pool, the
    slices of the older generation are still listed and are not counted twice."""
    def key(s: dict[str, Any]) -> tuple[str, int]:
        pool = table(s, "spec", "pool")
        generation = pool.get("generation")
        return str(pool.get("name", "")), generation if isinstance(generation, int) else 0

    newest: dict[str, int] = {}
    for s in slices:
        name, generation = key(s)
        newest[name] = max(newest.get(name, 0), generation)
    count = 0
    for s in slices:
        name, generation = key(s)
        devices = table(s, "spec").get("devices")
        if generation == newest[name] and isinstance(devices, list):
            count += len(devices)
    return count


def check_slices(ctx: Context) -> Check:
    if (skip := _no_api(ctx, SLICES)) is not None:
        return skip
    assert ctx.api is not None
    opts = ctx.options
    selector = f"spec.driver={opts.driver_name},spec.nodeName={opts.node_name}"
    try:
        version = _version(ctx.api)
        if version is None:
            return skipped(SLICES, "no usable resource.k8s.io version (see resource.k8s.io API)")
        slices = _slices(ctx.api, version, selector)
    except ApiCheckError as err:
        return warn(SLICES, str(err), "see API server and RBAC")
    expected = len(ctx.inventory().devices)
    published = published_devices(slices)
    if not slices:
        return fail(SLICES, f"no ResourceSlice with {selector}; discovery finds {expected} "
                    "device(s)", "read the agent's log on this node: it says why the API "
                    "server refused its slices (admission, RBAC, validation)")
    if published != expected:
        return fail(SLICES, f"{len(slices)} slice(s) publish {published} device(s); discovery "
                    f"finds {expected} now",
                    "read the agent's log (a rejected update keeps the old slices); restart "
                    "the agent if it does not catch up")
    return ok(SLICES, f"{len(slices)} slice(s) with {published} device(s), as discovery finds")


def shipped_classes(device_types: Sequence[str]) -> list[str]:
    """Names of the DeviceClasses the agent ships for the device types it offers."""
    from importlib.resources import files

    import yaml

    text = files("agent").joinpath("deviceclasses.yaml").read_text("utf-8")
    names = [str(d["metadata"]["name"]) for d in yaml.safe_load_all(text)
             if isinstance(d, dict) and d.get("kind") == "DeviceClass"]
    return [n for n in names if n.split(".", 1)[0] in device_types]


def check_classes(ctx: Context) -> Check:
    if (skip := _no_api(ctx, CLASSES)) is not None:
        return skip
    assert ctx.api is not None
    names = shipped_classes(ctx.options.device_types)
    missing: list[str] = []
    try:
        version = _version(ctx.api)
        if version is None:
            return skipped(CLASSES, "no usable resource.k8s.io version (see resource.k8s.io API)")
        for name in names:
            try:
                _get(ctx.api, f"/apis/{GROUP}/{version}/deviceclasses/{quote(name, safe='')}")
            except ApiCheckError as err:
                if err.status != 404:
                    raise
                missing.append(name)
    except ApiCheckError as err:
        return warn(CLASSES, str(err), "see API server and RBAC")
    if missing:
        return fail(CLASSES, f"not installed: {', '.join(missing)}",
                    "kubectl apply -f deploy/base/deviceclasses.yaml")
    return ok(CLASSES, f"installed: {', '.join(names)}")


def _review(http: Http, group: str, resource: str, *, sub: str, verb: str, node: str) -> bool:
    attrs = {"group": group, "resource": resource, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if resource == "nodes":
        attrs["name"] = node  # the Node authorizer allows a node its own object only
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    doc = _call(http, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body=body)
    return bool(isinstance(doc, dict) and (doc.get("status") or {}).get("allowed"))


def _user(http: Http) -> str:
    """Who the credentials are ("" when the server cannot say: SelfSubjectReview, 1.28+)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        doc = _call(http, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body)
    except ApiCheckError:
        return ""
    info = (doc.get("status") or {}).get("userInfo") or {} if isinstance(doc, dict) else {}
    return str(info.get("username", "")) if isinstance(info, dict) else ""


def check_rbac(ctx: Context) -> Check:
    if (skip := _no_api(ctx, RBAC)) is not None:
        return skip
    assert ctx.api is not None
    user = _user(ctx.api)
    if user.startswith("system:node:"):
        # The Node authorizer answers per object (this node's slices and pods' claims only),
        # which a review without the object cannot show: it would deny what the agent may do.
        return skipped(RBAC, f"{user}: the Node authorizer decides per object")
    denied: list[str] = []
    optional: list[str] = []
    lost: list[str] = []
    try:
        for group, resource, sub, verb, without in PERMISSIONS:
            if not _review(ctx.api, group, resource, sub=sub, verb=verb,
                           node=ctx.options.node_name):
                what = f"{verb} {resource}{'/' + sub if sub else ''}"
                (optional if without else denied).append(what)
                lost += [without] if without else []
    except ApiCheckError as err:
        return warn(RBAC, f"SelfSubjectAccessReview failed: {err}", "see API server")
    who = user or "these credentials"
    if denied:
        return fail(RBAC, f"{who} may not: {', '.join(denied + optional)}",
                    "kubectl apply -f deploy/base/rbac.yaml (ClusterRole dra-agent, bound to "
                    "the agent's ServiceAccount)")
    if optional:
        return warn(RBAC, f"{who} may not: {', '.join(optional)} (without it: "
                    f"{'; '.join(lost)})", "kubectl apply -f deploy/base/rbac.yaml")
    return ok(RBAC, f"{who} may do all {len(PERMISSIONS)} things the agent needs")
