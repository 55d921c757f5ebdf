"""The resource types the fake serves and how a URL path names one of them."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import APIError

RESOURCE_GROUP = "resource.k8s.io"
# Newest first; the order is also the preference order in discovery.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")
STORAGE_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class ResourceType:
    """What the registry knows about one resource (kind, scope, selectable fields, rules)."""

    group: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    field_labels: tuple[str, ...]
    #: Kinds with a field-label conversion of their own (the others use the default one).
    custom_field_labels: bool = False
    status_subresource: bool = False
    # ResourceSlice and DeviceClass strategies bump metadata.generation on a spec change.
    spec_generation: bool = False
    # ResourceClaim: POST clears status; the main endpoint keeps stored status (strategy).
    status_only_via_subresource: bool = False
    short_names: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        """`resourceslices.resource.k8s.io`, as NotFound/Conflict messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        """`ResourceSlice.resource.k8s.io`, as Invalid messages name it."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def versions(self) -> tuple[str, ...]:
        return RESOURCE_VERSIONS if self.group == RESOURCE_GROUP else ("v1",)


def _rt(
    group: str,
    plural: str,
    kind: str,
    namespaced: bool,
    extra_labels: tuple[str, ...] = (),
    status_subresource: bool = False,
    spec_generation: bool = False,
    status_only_via_subresource: bool = False,
    short_names: tuple[str, ...] = (),
) -> ResourceType:
    # A kind without its own field-label conversion gets DefaultMetaV1FieldSelectorConversion,
    # which takes metadata.namespace even for cluster-scoped kinds.
    labels = (
        ("metadata.name", "metadata.namespace")
        if namespaced or not extra_labels
        else ("metadata.name",)
    )
    return ResourceType(
        group=group,
        plural=plural,
        kind=kind,
        singular=kind.lower(),
        namespaced=namespaced,
        field_labels=labels + extra_labels,
        custom_field_labels=bool(extra_labels),
        status_subresource=status_subresource,
        spec_generation=spec_generation,
        status_only_via_subresource=status_only_via_subresource,
        short_names=short_names,
    )


def default_resources() -> dict[str, ResourceType]:
    """Every served resource by plural (plurals are unique across the groups we serve)."""
    types = [
        _rt(
            "",
            "nodes",
            "Node",
            False,
            extra_labels=("spec.unschedulable",),
            status_subresource=True,
            short_names=("no",),
        ),
        _rt(
            "",
            "namespaces",
            "Namespace",
            False,
            extra_labels=("status.phase",),
            status_subresource=True,
            short_names=("ns",),
        ),
        _rt(
            RESOURCE_GROUP,
            "resourceslices",
            "ResourceSlice",
            False,
            # spec.pool.name is selectable since 1.36 (1.35 answers 400).
            extra_labels=("spec.nodeName", "spec.driver", "spec.pool.name"),
            spec_generation=True,
        ),
        _rt(RESOURCE_GROUP, "deviceclasses", "DeviceClass", False, spec_generation=True),
        _rt(
            RESOURCE_GROUP,
            "resourceclaims",
            "ResourceClaim",
            True,
            status_subresource=True,
            status_only_via_subresource=True,
        ),
        _rt(RESOURCE_GROUP, "resourceclaimtemplates", "ResourceClaimTemplate", True),
    ]
    return {t.plural: t for t in types}


@dataclass(frozen=True, slots=True)
class Route:
    """A resource URL taken apart."""

    rtype: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool  # the legacy /watch/ form


def parse_resource_path(
    parts: list[str], resources: dict[str, ResourceType], served: tuple[str, ...]
) -> Route | None:
    """Split `/api/v1/...` or `/apis/<group>/<version>/...` (already split on `/`).

    Returns None when the path names nothing we serve, which the handler answers with 404.
    """
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
        if group == RESOURCE_GROUP and version not in served:
            return None
    else:
        return None
    watch = bool(rest) and rest[0] == "watch"
    if watch:
        rest = rest[1:]
    namespace = None
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and rest[2] in resources
        and resources[rest[2]].namespaced
        and resources[rest[2]].group == group
    ):
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in resources or len(rest) > 3:
        return None
    rtype = resources[rest[0]]
    if rtype.group != group or version not in rtype.versions():
        return None
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if sub is not None and (sub != "status" or not rtype.status_subresource or watch):
        return None
    if name == "":
        return None
    if rtype.namespaced and namespace is None and name is not None:
        return None
    return Route(rtype, version, namespace, name, sub, watch)


def check_served(route: Route, served: tuple[str, ...]) -> None:
    if route.rtype.group == RESOURCE_GROUP and route.version not in served:
        raise APIError(404, "the server could not find the requested resource")
