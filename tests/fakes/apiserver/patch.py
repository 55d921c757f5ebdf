"""The four PATCH bodies: JSON patch (RFC 6902), merge patch (RFC 7386), strategic merge, apply.

Strategic merge follows the Go `patchStrategy` tags of the kinds we serve: nearly every
resource.k8s.io list is atomic and is replaced whole, as in a merge patch; the exceptions are
listed in `MERGE_KEYS`.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import APIError, bad_request

Obj = dict[str, Any]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH)

# (plural, dotted list path) -> merge key, from the Go types' patchMergeKey tags.
MERGE_KEYS: dict[tuple[str, str], str] = {
    ("resourceclaims", "status.reservedFor"): "uid",
    ("nodes", "status.conditions"): "type",
    ("nodes", "status.addresses"): "type",
    ("nodes", "spec.taints"): "key",
    ("namespaces", "status.conditions"): "type",
}
_META_MERGE = {"metadata.ownerReferences": "uid"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(plural: str, target: Any, patch: Any, path: str = "") -> Any:
    """Merge patch plus merge-by-key for the lists that declare it, and `$patch` directives."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue  # ordering hints do not change content we compare
        sub = f"{path}.{key}" if path else key
        merge_key = MERGE_KEYS.get((plural, sub)) or _META_MERGE.get(sub)
        if value is None:
            out.pop(key, None)
        elif merge_key and isinstance(value, list):
            out[key] = _merge_list(plural, out.get(key), value, merge_key, sub)
        else:
            merged = strategic_merge_patch(plural, out.get(key), value, sub)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    return out


def _merge_list(plural: str, current: Any, patch: list[Any], key: str, path: str) -> list[Any]:
    items = [copy.deepcopy(i) for i in current] if isinstance(current, list) else []
    for entry in patch:
        if not isinstance(entry, dict) or key not in entry:
            raise bad_request(f"map: {entry} does not contain declared merge key: {key}")
    # Deletes go first, as upstream's mergeSliceWithSpecialElements runs before the merge.
    deleted = {e[key] for e in patch if e.get("$patch") == "delete"}
    items = [i for i in items if not (isinstance(i, dict) and i.get(key) in deleted)]
    entries = [e for e in patch if e.get("$patch") != "delete"]
    server_order = [i.get(key) if isinstance(i, dict) else None for i in items]
    for entry in entries:
        idx = next(
            (i for i, it in enumerate(items) if isinstance(it, dict) and it.get(key) == entry[key]),
            None,
        )
        if idx is None:
            items.append({k: v for k, v in entry.items() if k != "$patch"})
        else:
            items[idx] = strategic_merge_patch(plural, items[idx], entry, path)
    return _element_order(items, [e[key] for e in entries], server_order, key)


def _element_order(
    merged: list[Any], patch_keys: list[Any], server_order: list[Any], key: str
) -> list[Any]:
    """Upstream's normalizeElementOrder: patch items in patch order, server-only items in
    server order, interleaved by server position where both are known. A new item thus
    comes before the server-only ones (real servers answer [new, old], not [old, new])."""
    by_key = {i.get(key): i for i in merged if isinstance(i, dict)}
    right = [by_key[k] for k in dict.fromkeys(patch_keys) if k in by_key]
    left = [i for i in merged if not (isinstance(i, dict) and i.get(key) in patch_keys)]

    def pos(item: Any) -> int:
        k = item.get(key) if isinstance(item, dict) else None
        return server_order.index(k) if k in server_order else -1

    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right) or (i < len(left) and 0 <= pos(left[i]) < pos(right[j])):
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise APIError(
            422,
            f"the server rejected our request due to an error in our request: "
            f'invalid JSON pointer "{path}"',
        )
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _missing(path: str) -> APIError:
    return APIError(
        422,
        f"the server rejected our request due to an error in our request: "
        f'doc is missing path: "{path}": missing value',
    )


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _missing(path)
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for part in _pointer(path):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _missing(path)
    return cur


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-":
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), copy.deepcopy(value))
        else:
            raise _missing(path)
    else:
        raise _missing(path)
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        parent.pop(int(last))
    else:
        raise _missing(path)
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902; a failed `test` or a missing path is a 422 as the real server answers."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise APIError(
                422,
                "the server rejected our request due to an error in our request: invalid operation",
            )
        kind, path = op["op"], op["path"]
        if kind == "add":
            out = _add(out, path, op.get("value"))
        elif kind == "remove":
            out = _remove(out, path)
        elif kind == "replace":
            _get(out, path)
            out = _add(_remove(out, path), path, op.get("value")) if path else op.get("value")
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(out, op.get("from", "")))
            if kind == "move":
                out = _remove(out, op["from"])
            out = _add(out, path, value)
        elif kind == "test":
            if _get(out, path) != op.get("value"):
                raise APIError(
                    422,
                    "the server rejected our request due to an error in our "
                    f"request: testing value {path} failed: test failed",
                )
        else:
            raise APIError(
                422,
                "the server rejected our request due to an error in our "
                f"request: Unexpected kind: {kind}",
            )
    return out
