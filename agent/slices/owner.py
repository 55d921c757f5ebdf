"""Who the slices belong to, and how to recognise ours among shared node-less slices."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Owner:
    """The object the slices belong to; a Node owner also sets ``spec.nodeName``.

    ``uid`` None: the Node is looked up once (needs RBAC ``get nodes``). With a Node owner the
    garbage collector deletes the slices together with the Node.
    """

    kind: str = "Node"
    name: str = ""
    uid: str | None = None
    api_version: str = "v1"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Owner needs a name (the node name for a Node owner)")

    @property
    def is_node(self) -> bool:
        return self.kind == "Node" and self.api_version == "v1"


Filter = Callable[[Mapping[str, Any]], bool]


def accept_all(obj: Mapping[str, Any]) -> bool:
    return True


def owned_by(owner: Owner) -> Filter:
    """Node-less slices of a driver are shared by every node's agent: ours carry our owner."""

    def accepts(obj: Mapping[str, Any]) -> bool:
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any(
            isinstance(r, Mapping) and r.get("controller") is True
            and r.get("kind") == owner.kind and r.get("name") == owner.name
            for r in refs
        )

    return accepts
