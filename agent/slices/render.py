"""The ResourceSlice objects a node would publish, without an API server.

``dra-agent discover -o json|yaml`` shows these: exactly what the controller would create for
the same resources (same planner), with ``metadata.generateName`` since the server picks the
names.
"""

from __future__ import annotations

from typing import Any

from agent.slices.owner import Owner
from agent.slices.pools import to_desired
from agent.slices.sync import OwnerRef, plain, plan_pool
from agent.slices.versions import to_wire
from discovery.model import DriverResources


def render_slices(
    driver: str,
    owner: Owner | None,
    resources: DriverResources,
    version: str = "v1",
) -> list[dict[str, Any]]:
    """Every slice of every pool, pools by name, slices in index order.

    The owner reference carries the owner's uid when it is known, else an empty one (a Node
    uid is only known to the API server).
    """
    ref = OwnerRef(owner.api_version, owner.kind, owner.name, owner.uid or "") if owner else None
    out: list[dict[str, Any]] = []
    for name, state in sorted(to_desired(resources, owner).items()):
        plan = plan_pool(driver, name, state.pool, [], ref, generation_floor=state.pool.generation)
        # Plain copies: the plan shares the driver's mappings, and YAML needs dicts and lists.
        out += [plain(to_wire(create.obj, version)) for create in plan.creates]
    return out
