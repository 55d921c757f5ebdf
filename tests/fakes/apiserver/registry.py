"""Reads and deletes of the generic registry (get, list with paging, delete, deletecollection).

Writes live in `writes.py`. Both work on storage-form (v1) objects and convert at the edge to the
version the request named.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .convert import to_version
from .errors import APIError, FieldError, bad_request
from .resources import ResourceType, Route
from .selectors import make_matcher, parse_field_selector, parse_label_selector
from .store import Key, Store, TooOldError, key_text
from .validation import DEFAULT_FEATURE_GATES

Obj = dict[str, Any]


@dataclass
class Request:
    """What the registry needs from an HTTP request, already taken apart."""

    route: Route
    params: dict[str, str] = field(default_factory=dict)
    user_agent: str = ""
    content_type: str = ""

    def flag(self, name: str) -> bool:
        return self.params.get(name, "").lower() in ("1", "true")

    @property
    def dry_run(self) -> bool:
        return self.params.get("dryRun") == "All"


def now_rfc3339(clock: Callable[[], float]) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def options_invalid(kind: str, errs: list[FieldError]) -> APIError:
    return errors.invalid(f"{kind}.meta.k8s.io", "meta.k8s.io", kind, "", errs)


def _encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(data.get("rv"), int):
            raise ValueError("continue key is not valid")
        return data["rv"], str(data["start"])
    except (ValueError, binascii.Error, json.JSONDecodeError, TypeError, AttributeError) as e:
        raise bad_request(f"invalid continue token: {e}") from None


class Registry:
    def __init__(
        self,
        store: Store,
        resources: Mapping[str, ResourceType],
        gates: Mapping[str, bool] | None = None,
        clock: Callable[[], float] = time.time,
        too_large_wait: float = 3.0,
    ) -> None:
        self.store = store
        self.resources = resources
        self.gates = {**DEFAULT_FEATURE_GATES, **(gates or {})}
        self.clock = clock
        self.too_large_wait = too_large_wait

    # -- helpers shared with writes and watch ---------------------------------------------

    def now(self) -> str:
        return now_rfc3339(self.clock)

    def route_key(self, route: Route) -> Key:
        return (route.namespace or "", route.name or "")

    def not_found(self, rtype: ResourceType, name: str) -> APIError:
        return errors.not_found(rtype.qualified, rtype.group, rtype.plural, name)

    def served(self, route: Route, obj: Obj, with_type: bool = True) -> Obj:
        out = to_version(route.rtype, obj, route.version)
        if with_type:
            out = {
                "apiVersion": route.rtype.api_version(route.version),
                "kind": route.rtype.kind,
                **{k: v for k, v in out.items() if k not in ("apiVersion", "kind")},
            }
        else:
            out.pop("apiVersion", None)
            out.pop("kind", None)
        return out

    def matcher(self, req: Request) -> Callable[[Obj], bool]:
        route = req.route
        fields = parse_field_selector(
            req.params.get("fieldSelector", ""), route.rtype, route.version
        )
        labels = parse_label_selector(req.params.get("labelSelector", ""))
        if route.name is not None:
            for f in fields:
                if f.field == "metadata.name" and not f.negate and f.value != route.name:
                    raise bad_request("fieldSelector metadata.name doesn't match requested name")
        match = make_matcher(labels, fields, route.namespace)
        if route.name is None:
            return match
        name = route.name
        return lambda obj: (obj.get("metadata") or {}).get("name") == name and match(obj)

    # -- reads -------------------------------------------------------------------------------

    def get(self, req: Request) -> Obj:
        route = req.route
        obj = self.store.get(route.rtype.plural, self.route_key(route))
        if obj is None:
            raise self.not_found(route.rtype, route.name or "")
        return self.served(route, obj)

    def _list_revision(self, req: Request) -> int | None:
        """The revision a list must be served at (None: now), after the option checks."""
        p = req.params
        rv, match, limit = (
            p.get("resourceVersion", ""),
            p.get("resourceVersionMatch", ""),
            p.get("limit", ""),
        )
        if "sendInitialEvents" in p:
            raise options_invalid(
                "ListOptions",
                [
                    FieldError(
                        "Forbidden",
                        "sendInitialEvents",
                        None,
                        "sendInitialEvents is forbidden for list",
                    )
                ],
            )
        if match and not rv:
            raise options_invalid(
                "ListOptions",
                [
                    FieldError(
                        "Forbidden",
                        "resourceVersionMatch",
                        None,
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                ],
            )
        if match and match not in ("Exact", "NotOlderThan"):
            raise options_invalid(
                "ListOptions",
                [
                    FieldError(
                        "NotSupported",
                        "resourceVersionMatch",
                        match,
                        'supported values: "Exact", "NotOlderThan"',
                    )
                ],
            )
        if match == "Exact" and rv == "0":
            raise options_invalid(
                "ListOptions",
                [
                    FieldError(
                        "Forbidden",
                        "resourceVersionMatch",
                        None,
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                ],
            )
        if not rv or rv == "0":
            return None
        try:
            wanted = int(rv)
        except ValueError:
            raise bad_request(f"invalid resource version: {rv}") from None
        exact = match == "Exact" or (not match and limit not in ("", "0"))
        self.wait_for_revision(wanted)
        return wanted if exact else None

    def wait_for_revision(self, wanted: int) -> None:
        """A revision the server has not reached: wait a little (as the watch cache does),
        then 504 with ResourceVersionTooLarge."""
        store = self.store
        with store.cond:
            if wanted <= store.rv:
                return
            store.cond.wait_for(lambda: store.rv >= wanted, timeout=self.too_large_wait)
            if wanted > store.rv:
                raise APIError(
                    504,
                    f"Too large resource version: {wanted}, current: {store.rv}",
                    reason="Timeout",
                    details={
                        "causes": [
                            {
                                "reason": "ResourceVersionTooLarge",
                                "message": "Too large resource version",
                            }
                        ],
                        "retryAfterSeconds": 1,
                    },
                    headers={"Retry-After": "1"},
                )

    def list(self, req: Request) -> Obj:
        route, p = req.route, req.params
        match = self.matcher(req)
        token = p.get("continue", "")
        start = ""
        at_opt: int | None
        if token:
            if p.get("resourceVersion", "") not in ("", "0"):
                raise bad_request("specifying resource version is not allowed when using continue")
            at_opt, start = _decode_continue(token)
        else:
            at_opt = self._list_revision(req)
        try:
            with self.store.cond:
                at = self.store.rv if at_opt is None else at_opt
                snap = self.store.snapshot(route.rtype.plural, at_opt)
        except TooOldError as e:
            if token:
                raise APIError(
                    410,
                    "The provided continue parameter is too old to display a "
                    "consistent list result. You can start a new list without the "
                    "continue parameter, or use the continue token in this "
                    "response to retrieve the remainder of the results. "
                    "Continuing with the provided token results in an "
                    "inconsistent list - objects that were created, modified, or "
                    "deleted between the time the first chunk was returned and "
                    "now may show up in the list.",
                ) from None
            raise APIError(
                410,
                "The resourceVersion for the provided list is too old.",
                details={"causes": [{"message": str(e)}]},
            ) from None
        try:
            limit = int(p.get("limit") or 0)
        except ValueError:
            raise bad_request(f"invalid limit: {p.get('limit')}") from None
        keys = sorted((k for k in snap if key_text(k) >= start), key=key_text)
        items: list[Obj] = []
        meta: Obj = {"resourceVersion": str(at)}
        for i, k in enumerate(keys):
            obj = snap[k]
            if not match(obj):
                continue
            if limit and len(items) == limit:
                meta["continue"] = _encode_continue(at, key_text(items[-1]["_key"]) + "\x00")
                if not p.get("fieldSelector") and not p.get("labelSelector"):
                    meta["remainingItemCount"] = len(keys) - i
                break
            items.append({"_key": k, "obj": obj})
        return {
            "kind": f"{route.rtype.kind}List",
            "apiVersion": route.rtype.api_version(route.version),
            "metadata": meta,
            "items": [self.served(route, it["obj"], with_type=False) for it in items],
        }

    # -- deletes ------------------------------------------------------------------------------

    @staticmethod
    def _check_delete_preconditions(rtype: ResourceType, key: Key, meta: Obj, options: Obj) -> None:
        """rest.BeforeDelete checks preconditions early, naming the resource by its Kind."""
        pre = options.get("preconditions") or {}
        whys = (
            ("uid", "UID", "The object might have been deleted and then recreated"),
            ("resourceVersion", "ResourceVersion", "The object might have been modified"),
        )
        for field_name, label, hint in whys:
            want = pre.get(field_name)
            if want is not None and want != meta.get(field_name):
                raise errors.conflict(
                    rtype.group_kind,
                    rtype.group,
                    rtype.kind,
                    key[1],
                    f"the {label} in the precondition ({want}) does not match the {label} in "
                    f"record ({meta.get(field_name, '')}). {hint}",
                )

    def _delete_one(self, route: Route, key: Key, options: Obj, dry_run: bool) -> Obj:
        rtype = route.rtype
        with self.store.cond:
            old = self.store.get(rtype.plural, key)
            if old is None:
                raise self.not_found(rtype, key[1])
            meta = old["metadata"]
            self._check_delete_preconditions(rtype, key, meta, options)
            if dry_run:
                return old
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return old
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = self.now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                if new["metadata"].get("generation", 0) > 0:
                    new["metadata"]["generation"] += 1
                return self.store.commit(rtype.plural, key, new)
            return self.store.commit(rtype.plural, key, None)

    def delete(self, req: Request, options: Obj) -> tuple[int, Obj]:
        route = req.route
        policy = options.get("propagationPolicy") or req.params.get("propagationPolicy")
        if policy and policy not in ("Orphan", "Background", "Foreground"):
            raise options_invalid(
                "DeleteOptions",
                [
                    FieldError(
                        "NotSupported",
                        "propagationPolicy",
                        policy,
                        'supported values: "Foreground", "Background", "Orphan", "nil"',
                    )
                ],
            )
        dry = options.get("dryRun") == ["All"] or req.dry_run
        obj = self._delete_one(route, self.route_key(route), options, dry)
        if route.rtype.group:
            return 200, self.served(route, obj)
        gone = not (obj["metadata"].get("finalizers"))
        if not gone:
            return 200, self.served(route, obj)
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": route.name,
                "kind": route.rtype.plural,
                "uid": obj["metadata"].get("uid"),
            },
        }

    def delete_collection(self, req: Request, options: Obj) -> Obj:
        route = req.route
        match = self.matcher(req)
        dry = options.get("dryRun") == ["All"] or req.dry_run
        deleted: list[Obj] = []
        with self.store.cond:
            snap = self.store.snapshot(route.rtype.plural)
            for key in sorted(snap, key=key_text):
                obj = snap[key]
                if match(obj):
                    deleted.append(self._delete_one(route, key, {}, dry))
            rv = self.store.rv
        return {
            "kind": f"{route.rtype.kind}List",
            "apiVersion": route.rtype.api_version(route.version),
            "metadata": {"resourceVersion": str(rv)},
            "items": [self.served(route, o, with_type=False) for o in deleted],
        }
