"""A reduced server-side apply: field ownership per manager, conflicts, and field removal.

Simplification (documented in the package docstring): maps merge key by key, every list is
atomic (true for almost all resource.k8s.io lists), and ownership lives beside the object
instead of in `metadata.managedFields`.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import APIError

Obj = dict[str, Any]
Path = tuple[str, ...]
Owners = dict[str, set[Path]]

# Server-written or identity fields nobody owns.
_UNOWNED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generateName",
}


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Field paths to the values an object sets; lists and empty maps are single leaves."""
    out: dict[Path, Any] = {}
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if not prefix and key in ("apiVersion", "kind"):
            continue
        if prefix == ("metadata",) and key in _UNOWNED_META:
            continue
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            out.update(leaves(value, path))
        else:
            out[path] = value
    return out


def _get(obj: Any, path: Path) -> tuple[bool, Any]:
    cur = obj
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _set(obj: Obj, path: Path, value: Any) -> None:
    cur = obj
    for part in path[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[path[-1]] = copy.deepcopy(value)


def _delete(obj: Obj, path: Path) -> None:
    cur: Any = obj
    parents = []
    for part in path[:-1]:
        if not isinstance(cur, dict) or part not in cur:
            return
        parents.append((cur, part))
        cur = cur[part]
    if isinstance(cur, dict):
        cur.pop(path[-1], None)
    # Drop maps emptied by the removal, as the real apply does.
    for parent, part in reversed(parents):
        if parent[part] == {}:
            del parent[part]
        else:
            break


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _render(path: Path) -> str:
    return "." + ".".join(path)


def apply(
    current: Obj | None,
    config: Obj,
    manager: str,
    force: bool,
    owners: Owners,
    api_version: str,
) -> tuple[Obj, Owners]:
    """Merge `config` into `current` as `manager`; 409 when another manager owns a changed field."""
    applied = leaves(config)
    base = copy.deepcopy(current) if current is not None else {}
    new_owners = {m: set(paths) for m, paths in owners.items()}
    conflicts: dict[str, list[Path]] = {}
    for path, value in applied.items():
        present, now = _get(base, path)
        if present and now == value:
            continue
        for other, paths in new_owners.items():
            if other == manager:
                continue
            hit = [p for p in paths if _overlaps(p, path)]
            if hit:
                if force:
                    paths.difference_update(hit)
                else:
                    conflicts.setdefault(other, []).append(path)
    if conflicts:
        raise _conflict_error(conflicts, api_version)
    mine_before = new_owners.get(manager, set())
    others = set().union(*(p for m, p in new_owners.items() if m != manager))
    for path in mine_before:
        if path not in applied and not any(_overlaps(path, o) for o in others):
            _delete(base, path)
    for path, value in applied.items():
        _set(base, path, value)
    for key in ("apiVersion", "kind"):
        if key in config:
            base[key] = config[key]
    meta = config.get("metadata") or {}
    base.setdefault("metadata", {})
    for key in ("name", "namespace", "generateName"):
        if key in meta and key not in base["metadata"]:
            base["metadata"][key] = meta[key]
    if "resourceVersion" in meta:
        base["metadata"]["resourceVersion"] = meta["resourceVersion"]
    new_owners[manager] = set(applied)
    return base, {m: p for m, p in new_owners.items() if p}


def record_update(old: Obj | None, new: Obj, manager: str, owners: Owners) -> Owners:
    """A non-apply write takes ownership of the fields it changed (operation Update)."""
    before = leaves(old) if old is not None else {}
    after = leaves(new)
    changed = {p for p, v in after.items() if before.get(p, object()) != v}
    removed = {p for p in before if p not in after}
    out: Owners = {}
    for m, paths in owners.items():
        keep = {p for p in paths if not any(_overlaps(p, c) for c in changed | removed)}
        if keep:
            out[m] = keep
    if changed:
        out.setdefault(manager, set()).update(changed)
    return out


def _conflict_error(conflicts: dict[str, list[Path]], api_version: str) -> APIError:
    total = sum(len(v) for v in conflicts.values())
    causes = []
    lines = []
    for mgr, paths in conflicts.items():
        for p in sorted(paths):
            causes.append(
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "{mgr}" using {api_version}',
                    "field": _render(p),
                }
            )
    if total == 1:
        ((mgr, paths),) = conflicts.items()
        text = f'conflict with "{mgr}" using {api_version}: {_render(paths[0])}'
        message = f"Apply failed with 1 conflict: {text}"
    else:
        for mgr, paths in conflicts.items():
            lines.append(f'conflicts with "{mgr}" using {api_version}:')
            lines.extend(f"- {_render(p)}" for p in sorted(paths))
        message = f"Apply failed with {total} conflicts: " + "\n".join(lines)
    return APIError(409, message, details={"causes": causes})
