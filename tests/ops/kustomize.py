"""A small kustomize, for machines without kubectl (CI runs on a clean Debian 12).

It implements exactly the features deploy/ uses, with kustomize's semantics, and refuses
everything else by name, so a manifest that starts using a new feature fails here instead of
rendering wrong. Where kubectl exists, the tests render with both and compare.

Supported: ``resources`` (files and kustomization directories), ``labels``
(``pairs``, ``includeSelectors: false``, ``includeTemplates``), ``images`` (``newName``,
``newTag``, ``digest``), ``patches`` (strategic merge by object identity or ``target``;
JSON 6902 ``add``/``replace``/``remove``/``test`` with a ``target``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests.ops.openapi import load_documents

Obj = dict[str, Any]

# No "namespace": kustomize 5.x stamps it on kinds it does not know to be cluster-scoped
# (DeviceClass, ValidatingAdmissionPolicy), so deploy/ names namespaces in the objects instead.
_SUPPORTED = {"apiVersion", "kind", "resources", "labels", "images", "patches"}
#: Strategic-merge keys of the lists deploy/ patches (from the Kubernetes API types).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}


class KustomizeError(ValueError):
    """The kustomization uses something this renderer does not implement, or is wrong."""


def render(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize directory`` prints (order aside)."""
    kfile = directory / "kustomization.yaml"
    if not kfile.exists():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    (spec,) = load_documents(kfile)
    unknown = set(spec) - _SUPPORTED
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported by the test renderer: {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += load_documents(path)
    for patch in spec.get("patches", []):
        _apply_patch(directory, patch, objects)
    for entry in spec.get("labels", []):
        _apply_labels(entry, objects)
    for image in spec.get("images", []):
        for obj in objects:
            _apply_image(image, obj)
    return objects


def _identity(obj: Obj) -> tuple[str, str, str]:
    return (str(obj.get("kind")), str(obj["metadata"]["name"]), str(obj["apiVersion"]))


def _matches(target: Obj, obj: Obj) -> bool:
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    meta = obj.get("metadata", {})
    checks = {
        "group": group,
        "version": version,
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
    }
    unknown = set(target) - set(checks)
    if unknown:
        raise KustomizeError(f"patch target fields not supported: {sorted(unknown)}")
    return all(checks[k] == v for k, v in target.items())


def _apply_patch(directory: Path, patch: Obj, objects: list[Obj]) -> None:
    if "path" in patch:
        docs = load_documents(directory / patch["path"])
        if len(docs) != 1:
            raise KustomizeError(f"{patch['path']}: one patch per file, found {len(docs)}")
        body = docs[0]
    elif "patch" in patch:
        import yaml

        body = yaml.safe_load(patch["patch"])
    else:
        raise KustomizeError(f"patch without path or patch: {patch}")
    target = patch.get("target")
    if isinstance(body, list):  # JSON 6902
        if target is None:
            raise KustomizeError("a JSON 6902 patch needs a target")
        hits = [o for o in objects if _matches(target, o)]
        if not hits:
            raise KustomizeError(f"patch target {target} matches nothing")
        for obj in hits:
            for op in body:
                _json6902(obj, op)
        return
    if target is not None:
        hits = [o for o in objects if _matches(target, o)]
    else:
        hits = [o for o in objects if _identity(o) == _identity(body)]
    if not hits:
        raise KustomizeError(f"strategic merge patch {_identity(body)} matches no resource")
    for obj in hits:
        _merge(obj, body)


def _merge(base: Obj, patch: Obj) -> None:
    """Strategic merge: maps merge, keyed lists merge by key, other lists are replaced.

    New keyed items go first, in patch order, as kustomize's merge places them.
    """
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list) and key in _MERGE_KEYS:
            mkey = _MERGE_KEYS[key]
            existing = {item.get(mkey): item for item in base[key]}
            added = []
            for item in value:
                if item.get(mkey) in existing:
                    _merge(existing[item[mkey]], item)
                else:
                    added.append(copy.deepcopy(item))
            base[key] = added + base[key]
        else:
            base[key] = copy.deepcopy(value)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json6902(obj: Obj, op: Obj) -> None:
    parts = _pointer(op["path"])
    parent: Any = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    kind = op["op"]
    if kind == "test":
        current = parent[int(last)] if isinstance(parent, list) else parent[last]
        if current != op["value"]:
            raise KustomizeError(f"test failed at {op['path']}: {current!r} != {op['value']!r}")
    elif kind in ("add", "replace"):
        value = copy.deepcopy(op["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            elif kind == "add":
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            if kind == "replace" and last not in parent:
                raise KustomizeError(f"replace of missing {op['path']}")
            parent[last] = value
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        raise KustomizeError(f"JSON 6902 op {kind!r} not supported")


def _apply_labels(entry: Obj, objects: list[Obj]) -> None:
    if entry.get("includeSelectors"):
        raise KustomizeError("labels.includeSelectors: true is not supported")
    pairs = entry.get("pairs", {})
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        template = obj.get("spec", {}).get("template")
        if entry.get("includeTemplates") and isinstance(template, dict):
            template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _split_image(image: str) -> tuple[str, str]:
    """``repo[:tag][@digest]`` -> (repo, the rest including its separator)."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _apply_image(image: Obj, obj: Obj) -> None:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name, suffix = _split_image(container.get("image", ""))
        if name != image["name"]:
            continue
        name = image.get("newName", name)
        if "digest" in image:
            suffix = "@" + image["digest"]
        elif "newTag" in image:
            suffix = ":" + str(image["newTag"])
        container["image"] = name + suffix
