"""Create, update (PUT), PATCH and server-side apply, as the generic store and strategies do."""

from __future__ import annotations

import copy
import json
import random
import uuid
from typing import Any

import yaml

from . import errors
from .apply import apply, record_update
from .convert import from_version
from .errors import APIError, FieldError, bad_request
from .patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_TYPES,
    STRATEGIC_PATCH,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from .registry import Registry, Request, key_of, options_invalid
from .resources import ResourceType
from .schema import apply_field_validation, decode, omit_empty
from .store import Key, key_text
from .validation import (
    default_claim_spec,
    default_slice,
    drop_deallocated_devices,
    drop_disabled_slice_fields,
    validate_object,
)

Obj = dict[str, Any]

# names/generate.go: 5 random characters from this alphabet, prefix cut to 58.
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
MAX_GENERATED_PREFIX = 58
GENERATE_NAME_RETRIES = 8
_SERVER_META = (
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "creationTimestamp",
    "generation",
    "uid",
    "managedFields",
    "selfLink",
)


class Writer:
    def __init__(self, registry: Registry, rng: random.Random | None = None) -> None:
        self.reg = registry
        self.rng = rng or random.Random()

    # -- shared steps --------------------------------------------------------------------------

    def _decode(self, req: Request, body: Any) -> tuple[Obj, list[str]]:
        """Type-check and prune in the served version, then convert to the stored form."""
        route = req.route
        mode = req.params.get("fieldValidation", "Warn") or "Warn"
        if mode not in ("Ignore", "Warn", "Strict"):
            raise bad_request(
                f'fieldValidation must be one of "Ignore", "Warn" or "Strict": {mode}'
            )
        if isinstance(body, dict):
            want = route.rtype.api_version(route.version)
            if body.get("apiVersion") and body["apiVersion"] != want:
                raise bad_request(
                    f"the API version in the data ({body['apiVersion']}) does not "
                    f"match the expected API version ({want})"
                )
            if body.get("kind") and body["kind"] != route.rtype.kind:
                raise bad_request(
                    f"the kind in the data ({body['kind']}) does not match the "
                    f"expected kind ({route.rtype.kind})"
                )
        decoded = decode(route.rtype, route.version, body)
        kind = route.rtype.kind
        is_patch = req.content_type.split(";")[0].strip() in PATCH_TYPES
        prefix = (
            ""
            if is_patch
            else f'{kind} in version "{route.version}" cannot be handled as a {kind}: '
        )
        warnings = apply_field_validation(mode, decoded, prefix)
        obj = from_version(route.rtype, decoded.obj, route.version)
        obj["apiVersion"] = route.rtype.api_version("v1")
        obj["kind"] = route.rtype.kind
        obj.setdefault("metadata", {})
        return obj, warnings

    def prepare(self, rtype: ResourceType, obj: Obj, old: Obj | None) -> None:
        """Strategy PrepareFor{Create,Update}: gate drops and server-side defaults (the real
        decoder defaults every write, so an update without defaults equals the stored spec)."""
        spec = obj.get("spec")
        if rtype.plural == "resourceslices" and isinstance(spec, dict):
            drop_disabled_slice_fields(spec, (old or {}).get("spec"), self.reg.gates)
            default_slice(spec, self.reg.now())
        if rtype.plural == "resourceclaims" and isinstance(spec, dict):
            default_claim_spec(spec)
        if rtype.plural == "resourceclaims" and old is not None and "status" in obj:
            drop_deallocated_devices(obj["status"] or {}, old.get("status") or {})
        inner = spec.get("spec") if isinstance(spec, dict) else None
        if rtype.plural == "resourceclaimtemplates" and isinstance(inner, dict):
            default_claim_spec(inner)

    def _validate(self, req: Request, obj: Obj, old: Obj | None) -> None:
        rtype = req.route.rtype
        errs = validate_object(rtype, obj, old, req.route.subresource)
        if errs:
            name = obj["metadata"].get("name") or ""
            raise errors.invalid(rtype.group_kind, rtype.group, rtype.kind, name, errs)

    def _manager(self, req: Request) -> str:
        return req.params.get("fieldManager") or req.user_agent.split("/")[0] or "unknown"

    # -- create -------------------------------------------------------------------------------

    def create(self, req: Request, body: Any) -> tuple[int, Obj, list[str]]:
        obj, warnings = self._decode(req, body)
        return 201, self._create(req, obj), warnings

    def _create(self, req: Request, obj: Obj, owners: dict[str, Any] | None = None) -> Obj:
        route, rtype = req.route, req.route.rtype
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        if rtype.namespaced:
            if meta.get("namespace") and meta["namespace"] != route.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            meta["namespace"] = route.namespace
        else:
            meta.pop("namespace", None)
        for f in _SERVER_META:
            meta.pop(f, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.reg.now()
        if rtype.spec_generation:
            meta["generation"] = 1
        if rtype.status_only_via_subresource:
            obj.pop("status", None)
        if rtype.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        generate = meta.get("generateName", "")
        if not meta.get("name") and generate:
            meta["name"] = self.generate_name(generate)
        self.prepare(rtype, obj, None)
        self._validate(req, obj, None)
        omit_empty(rtype, obj)
        store = self.reg.store
        with store.cond:
            if rtype.namespaced and not req.params.get("_skip_ns_check"):
                ns = store.get("namespaces", ("", route.namespace or ""))
                if ns is None:
                    raise errors.not_found("namespaces", "", "namespaces", route.namespace or "")
            for attempt in range(GENERATE_NAME_RETRIES + 1):
                existing = store.get(rtype.plural, key_of(obj))
                if existing is None:
                    break
                if not generate or attempt == GENERATE_NAME_RETRIES:
                    raise errors.already_exists(
                        rtype.qualified,
                        rtype.group,
                        rtype.plural,
                        meta["name"],
                        terminating=bool(existing["metadata"].get("deletionTimestamp")),
                    )
                meta["name"] = self.generate_name(generate)
            if req.dry_run:
                return self.reg.served(route, obj)
            stored = store.commit(rtype.plural, key_of(obj), obj)
            st = store.state(rtype.plural)
            st.owners[key_of(obj)] = (
                owners
                if owners is not None
                else record_update(None, stored, self._manager(req), {})
            )
            return self.reg.served(route, stored)

    def generate_name(self, prefix: str) -> str:
        suffix = "".join(self.rng.choice(NAME_ALPHABET) for _ in range(5))
        return prefix[:MAX_GENERATED_PREFIX] + suffix

    # -- update -------------------------------------------------------------------------------

    def update(self, req: Request, body: Any) -> tuple[int, Obj, list[str]]:
        route = req.route
        obj, warnings = self._decode(req, body)
        if obj["metadata"].get("name") != route.name:
            raise bad_request(
                f"the name of the object ({obj['metadata'].get('name', '')}) does "
                f"not match the name on the URL ({route.name})"
            )
        if route.rtype.namespaced and obj["metadata"].get("namespace") not in (
            None,
            "",
            route.namespace,
        ):
            raise bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request"
            )
        with self.reg.store.cond:
            old = self.reg.store.get(route.rtype.plural, self.reg.route_key(route))
            if old is None:
                raise self.reg.not_found(route.rtype, route.name or "")
            return 200, self._update(req, obj, old), warnings

    def _update(
        self, req: Request, obj: Obj, old: Obj, owners: dict[str, Any] | None = None
    ) -> Obj:
        route, rtype = req.route, req.route.rtype
        key: Key = self.reg.route_key(route)
        meta, old_meta = obj["metadata"], old["metadata"]
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            # A uid in the body becomes a storage precondition (rest.Update), checked before
            # the update runs: a 409 storage error, not a 422 for an immutable field.
            raise errors.conflict(
                rtype.qualified,
                rtype.group,
                rtype.plural,
                route.name or "",
                f"StorageError: invalid object, Code: 4, Key: /registry/{rtype.plural}/"
                f"{key_text(key)}, ResourceVersion: 0, AdditionalErrorMsg: Precondition "
                f"failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{old_meta.get('uid', '')}",
            )
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old_meta["resourceVersion"]:
            raise errors.conflict(
                rtype.qualified, rtype.group, rtype.plural, route.name or "", errors.STALE
            )
        if route.subresource == "status":
            # ResetObjectMetaForStatus + keep spec: only status comes from the request.
            new = copy.deepcopy(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            obj, meta = new, new["metadata"]
        else:
            if rtype.status_subresource:
                if "status" in old:
                    obj["status"] = copy.deepcopy(old["status"])
                else:
                    obj.pop("status", None)
            if not meta.get("uid"):
                meta["uid"] = old_meta.get("uid")
            for f in (
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "name",
            ):
                if f in old_meta:
                    meta[f] = old_meta[f]
                else:
                    meta.pop(f, None)
            meta.pop("managedFields", None)
            if "generateName" not in old_meta:
                meta.pop("generateName", None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        self.prepare(rtype, obj, old)
        self._validate(req, obj, old)
        omit_empty(rtype, obj)
        if rtype.spec_generation and obj.get("spec") != old.get("spec"):
            meta["generation"] = old_meta.get("generation", 0) + 1
        store = self.reg.store
        if obj == old:
            return self.reg.served(route, old)  # no-op write: no new revision, no event
        if req.dry_run:
            return self.reg.served(route, obj)
        new_owners = (
            owners
            if owners is not None
            else record_update(
                old, obj, self._manager(req), store.state(rtype.plural).owners.get(key, {})
            )
        )
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            gone = store.commit(rtype.plural, key, None)
            return self.reg.served(route, gone)
        stored = store.commit(rtype.plural, key, obj)
        store.state(rtype.plural).owners[key] = new_owners
        return self.reg.served(route, stored)

    # -- patch and apply ----------------------------------------------------------------------

    def patch(self, req: Request, raw: bytes) -> tuple[int, Obj, list[str]]:
        ctype = req.content_type.split(";")[0].strip()
        if ctype not in PATCH_TYPES:
            # The route itself refuses the type (go-restful's Consumes), before any handler.
            raise APIError(415, "415: Unsupported Media Type", details={})
        force = req.params.get("force")
        if ctype == APPLY_PATCH:
            if not req.params.get("fieldManager"):
                raise options_invalid(
                    "PatchOptions",
                    [FieldError("Required", "fieldManager", None, "is required for apply patch")],
                )
            return self._apply(req, raw, force is not None and force.lower() == "true")
        if force is not None:
            raise options_invalid(
                "PatchOptions",
                [
                    FieldError(
                        "Forbidden", "force", None, "may not be specified for non-apply patch"
                    )
                ],
            )
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError as e:
            raise bad_request(f"error decoding patch: {e}") from None
        route = req.route
        with self.reg.store.cond:
            old = self.reg.store.get(route.rtype.plural, self.reg.route_key(route))
            if old is None:
                raise self.reg.not_found(route.rtype, route.name or "")
            current = self.reg.served(route, old)
            if ctype == JSON_PATCH:
                patched = json_patch(current, body)
            elif ctype == MERGE_PATCH:
                if not isinstance(body, dict):
                    raise bad_request("error decoding patch: merge patch must be a JSON object")
                patched = merge_patch(current, body)
            else:
                assert ctype == STRATEGIC_PATCH
                if not isinstance(body, dict):
                    raise bad_request(
                        "error decoding patch: strategic merge patch must be a JSON object"
                    )
                patched = strategic_merge_patch(route.rtype.plural, current, body)
            obj, warnings = self._decode(req, patched)
            if obj["metadata"].get("name") != route.name:
                raise bad_request("the name of the object does not match the name on the URL")
            return 200, self._update(req, obj, old), warnings

    def _apply(self, req: Request, raw: bytes, force: bool) -> tuple[int, Obj, list[str]]:
        route = req.route
        try:
            config = yaml.safe_load(raw.decode("utf-8") if raw else "")
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise bad_request(f"error decoding YAML: {e}") from None
        if not isinstance(config, dict):
            raise bad_request("error decoding YAML: the apply configuration must be an object")
        if not config.get("apiVersion") or not config.get("kind"):
            raise bad_request(
                "invalid object type: apiVersion and kind must be set in an apply configuration"
            )
        name = (config.get("metadata") or {}).get("name")
        if name not in (None, route.name):
            raise bad_request(
                f"the name of the object ({name}) does not match the name on the URL ({route.name})"
            )
        cfg, warnings = self._decode(req, config)
        cfg["metadata"]["name"] = route.name
        manager = req.params["fieldManager"]
        api_version = route.rtype.api_version(route.version)
        store = self.reg.store
        with store.cond:
            key = self.reg.route_key(route)
            old = store.get(route.rtype.plural, key)
            owners = store.state(route.rtype.plural).owners.get(key, {}) if old else {}
            merged, new_owners = apply(old, cfg, manager, force, owners, api_version)
            if old is None:
                merged["metadata"].pop("resourceVersion", None)
                return 201, self._create(req, merged, new_owners), warnings
            return 200, self._update(req, merged, old, new_owners), warnings
