"""The controller's only door to the API server: plain dicts over ``agent.kube.transport``.

Typed models of the ``kubernetes`` package silently drop fields they do not know (research:
python-stack.md §2), which would make a newer server's fields vanish on every update. So this
wrapper sends and receives JSON dicts through ``KubeHTTP`` and raises ``ApiError`` (the
transport's ``KubeAPIError``) carrying the Status the server sent. Objects cross this boundary
in v1 shape; conversion to older versions happens here (versions.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from agent.kube.errors import TRANSIENT_STATUSES, Cause, KubeAPIError, parse_status
from agent.kube.stream import LineStream
from agent.kube.transport import DEFAULT_TIMEOUT, KubeHTTP
from agent.slices.versions import GROUP, from_wire, to_wire

#: (connect, read) seconds for ordinary requests; a stuck server must not stall the worker.
REQUEST_TIMEOUT = DEFAULT_TIMEOUT
LIST_PAGE_SIZE = 500
#: The controller's error is the transport's: status, reason, message and causes of a Status.
ApiError = KubeAPIError

__all__ = ["TRANSIENT_STATUSES", "ApiError", "Cause", "KubeSliceClient", "SliceClient"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    obj: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        rv = self.obj.get("metadata", {}).get("resourceVersion")
        return rv if isinstance(rv, str) else None


#: The annotation of the BOOKMARK that ends a watch-list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def is_initial_end(event: WatchEvent) -> bool:
    """Whether ``event`` is the BOOKMARK after a watch-list's initial events."""
    if event.type != "BOOKMARK":
        return False
    annotations = event.obj.get("metadata", {}).get("annotations") or {}
    return isinstance(annotations, Mapping) and annotations.get(INITIAL_EVENTS_END) == "true"


@dataclass(slots=True)
class SliceList:
    items: list[dict[str, Any]]
    resource_version: str
    requests: int = field(default=1)


class WatchStream(Protocol):
    def __iter__(self) -> Iterator[WatchEvent]: ...

    def close(self) -> None:
        """Unblock a reader in another thread and release the connection."""


@runtime_checkable
class SliceClient(Protocol):
    """What the controller needs from the API server; tests may pass their own."""

    def served_versions(self) -> list[str]: ...

    def node_uid(self, name: str) -> str: ...

    def list(self, version: str, field_selector: str) -> SliceList: ...

    def watch(
        self, version: str, field_selector: str, resource_version: str, timeout_s: int
    ) -> WatchStream: ...

    def watch_list(self, version: str, field_selector: str, timeout_s: int) -> WatchStream:
        """A watch that begins with the current state: an ADDED event per object, then a
        BOOKMARK annotated ``k8s.io/initial-events-end`` (``is_initial_end``), then changes.
        Raises ``ApiError`` 422 where the server has no watch-list (WatchList off)."""
        ...

    def get(self, version: str, name: str) -> dict[str, Any] | None: ...

    def create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def update(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete(
        self, version: str, name: str, uid: str | None, resource_version: str | None
    ) -> str | None:
        """Delete with preconditions; return the deletion resourceVersion when known."""


def _collection(version: str) -> str:
    return f"/apis/{GROUP}/{version}/resourceslices"


def _item(version: str, name: str) -> str:
    return f"{_collection(version)}/{quote(name, safe='')}"


class KubeSliceClient:
    """``SliceClient`` over a ``KubeHTTP``."""

    def __init__(
        self, http: KubeHTTP, field_manager: str = "dra-agent", page_size: int = LIST_PAGE_SIZE
    ) -> None:
        self._http = http
        self._field_manager = field_manager
        self._page_size = page_size

    def _json(
        self, verb: str, path: str, query: list[tuple[str, str]] | None = None, body: Any = None
    ) -> Any:
        response = self._http.request(verb, path, query=query, body=body, timeout=REQUEST_TIMEOUT)
        return response.raise_for_status().json()

    # -- SliceClient ------------------------------------------------------------------------

    def served_versions(self) -> list[str]:
        """Versions of resource.k8s.io the server serves (empty if the group is unknown)."""
        try:
            group = self._json("GET", f"/apis/{GROUP}")
        except ApiError as err:
            if err.not_found:
                return []
            raise
        versions = group.get("versions") or []
        return [v["version"] for v in versions if isinstance(v, Mapping) and "version" in v]

    def node_uid(self, name: str) -> str:
        node = self._json("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        uid = node.get("metadata", {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise ApiError("GET", f"/api/v1/nodes/{name}", 0, "BadResponse", "node has no uid")
        return uid

    def list(self, version: str, field_selector: str) -> SliceList:
        items: list[dict[str, Any]] = []
        query = [("fieldSelector", field_selector), ("limit", str(self._page_size))]
        requests = 0
        cont = ""
        while True:
            page_query = query + ([("continue", cont)] if cont else [])
            try:
                data = self._json("GET", _collection(version), page_query)
            except ApiError as err:
                raise _with_selector(err, field_selector) from err
            requests += 1
            items += [from_wire(o, version) for o in data.get("items") or []]
            meta = data.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return SliceList(items, str(meta.get("resourceVersion", "")), requests)

    def watch(
        self, version: str, field_selector: str, resource_version: str, timeout_s: int
    ) -> WatchStream:
        return self._watch(version, field_selector, timeout_s,
                           [("resourceVersion", resource_version)])

    def watch_list(self, version: str, field_selector: str, timeout_s: int) -> WatchStream:
        # client-go's watch-list: the list streamed from the watch cache, no request of its
        # own (the upstream controller's informer starts so against 1.34+ servers).
        return self._watch(version, field_selector, timeout_s,
                           [("sendInitialEvents", "true"),
                            ("resourceVersionMatch", "NotOlderThan")])

    def _watch(self, version: str, field_selector: str, timeout_s: int,
               start: Sequence[tuple[str, str]]) -> WatchStream:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("fieldSelector", field_selector),
            *start,
            ("timeoutSeconds", str(timeout_s)),
        ]
        # The server ends the stream after timeout_s; a read that outlives that by far means
        # the connection is dead without a FIN (network partition).
        try:
            lines = self._http.stream(
                "GET", _collection(version), query, timeout=(5.0, timeout_s + 30.0)
            )
        except ApiError as err:
            raise _with_selector(err, field_selector) from err
        return _HttpWatchStream(lines, version, _collection(version))

    def get(self, version: str, name: str) -> dict[str, Any] | None:
        try:
            return from_wire(self._json("GET", _item(version, name)), version)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = to_wire(obj, version)
        query = [("fieldManager", self._field_manager)]
        return from_wire(self._json("POST", _collection(version), query, body), version)

    def dry_run_create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``create`` with ``dryRun=All``: validated and admitted, never stored (listattrs)."""
        body = to_wire(obj, version)
        query = [("fieldManager", self._field_manager), ("dryRun", "All")]
        return from_wire(self._json("POST", _collection(version), query, body), version)

    def update(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = to_wire(obj, version)
        query = [("fieldManager", self._field_manager)]
        path = _item(version, obj["metadata"]["name"])
        return from_wire(self._json("PUT", path, query, body), version)

    def delete(
        self, version: str, name: str, uid: str | None, resource_version: str | None
    ) -> str | None:
        preconditions: dict[str, str] = {}
        if uid:
            preconditions["uid"] = uid
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        answer = self._json("DELETE", _item(version, name), None, body)
        # resourceslices answer with the deleted object, its resourceVersion the deletion's.
        rv = answer.get("metadata", {}).get("resourceVersion") if answer.get("spec") else None
        return rv if isinstance(rv, str) else None


class _HttpWatchStream:
    """Watch events decoded from the lines of a chunked HTTP answer."""

    def __init__(self, lines: LineStream, version: str, path: str) -> None:
        self._lines = lines
        self._version = version
        self._path = path

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for line in self._lines:
                yield self._event(line)
        except ApiError as err:
            if err.verb == "WATCH":
                raise
            raise ApiError("WATCH", self._path, err.status, err.reason, err.message,
                           causes=err.causes) from err
        finally:
            self._lines.close()

    def _event(self, line: bytes) -> WatchEvent:
        try:
            data = json.loads(line)
        except ValueError as err:
            raise ApiError("WATCH", self._path, 0, "BadResponse", f"bad event: {err}") from err
        kind = data.get("type")
        obj = data.get("object") or {}
        if kind == "ERROR":
            raise parse_status("WATCH", self._path, int(obj.get("code") or 0), json.dumps(obj))
        if kind == "BOOKMARK":
            return WatchEvent("BOOKMARK", obj)
        return WatchEvent(str(kind), from_wire(obj, self._version))

    def close(self) -> None:
        """Unblocks a reader in another thread (``LineStream.close`` shuts the socket)."""
        self._lines.close()


def _with_selector(err: ApiError, field_selector: str) -> ApiError:
    """The same error, its path naming the selector (which scope failed, for the operator)."""
    return ApiError(err.verb, f"{err.path}?fieldSelector={field_selector}", err.status,
                    err.reason, err.message, causes=err.causes, details=err.details)
