"""The controller's only door to the API server: plain dicts over the client's REST layer.

Typed models of the ``kubernetes`` package silently drop fields they do not know (research:
python-stack.md §2), which would make a newer server's fields vanish on every update. So this
wrapper sends and receives JSON dicts through ``ApiClient.param_serialize`` / ``call_api`` and
raises ``ApiError`` carrying the Status the server sent. Objects cross this boundary in v1
shape; conversion to older versions happens here (versions.py).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from agent.slices.versions import GROUP, from_wire, to_wire

#: (connect, read) seconds for ordinary requests; a stuck server must not stall the worker.
REQUEST_TIMEOUT = (5.0, 30.0)
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
LIST_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class Cause:
    field: str
    reason: str
    message: str


class ApiError(Exception):
    """An API request that failed; ``status`` 0 means no HTTP answer (refused, timed out)."""

    def __init__(
        self,
        verb: str,
        path: str,
        status: int,
        reason: str,
        message: str,
        *,
        causes: Sequence[Cause] = (),
    ) -> None:
        where = f"{verb} {path}"
        text = f"{where}: {status} {reason}: {message}" if status else f"{where}: {message}"
        super().__init__(text)
        self.verb = verb
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = tuple(causes)

    @property
    def transient(self) -> bool:
        """Worth retrying unchanged after a pause (server or network trouble)."""
        return self.status in TRANSIENT_STATUSES

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def invalid(self) -> bool:
        return self.status == 422

    @property
    def expired(self) -> bool:
        return self.status == 410


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    obj: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        rv = self.obj.get("metadata", {}).get("resourceVersion")
        return rv if isinstance(rv, str) else None


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
    """``SliceClient`` over a ``kubernetes.client.ApiClient`` (auth, TLS, proxies from it)."""

    def __init__(
        self, api_client: Any, field_manager: str = "dra-agent", page_size: int = LIST_PAGE_SIZE
    ) -> None:
        if not hasattr(api_client, "param_serialize"):
            # Older clients (< 37) have another call_api; fail loudly instead of retrying
            # an AttributeError forever as if the server were down.
            import kubernetes

            raise TypeError(
                "the ResourceSlice controller needs kubernetes (python client) >= 37, "
                f"found {getattr(kubernetes, '__version__', 'unknown')}"
            )
        self._client = api_client
        self._field_manager = field_manager
        self._page_size = page_size

    # -- plumbing ---------------------------------------------------------------------------

    def _send(
        self,
        verb: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        timeout: Any = REQUEST_TIMEOUT,
    ) -> Any:
        """Send one request; return the raw urllib3 response (unread) on 2xx."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            # The body is left out of param_serialize: its model-aware walk over a dict of
            # 2,048 devices costs more than the request. The REST layer json.dumps it as is.
            method, url, header_params, _, post = self._client.param_serialize(
                verb, path, query_params=list(query), header_params=headers,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method, url, header_params=header_params, body=body, post_params=post,
                _request_timeout=timeout,
            )
        except Exception as err:  # urllib3/socket errors: no HTTP answer at all
            if isinstance(err, ApiError):
                raise
            raise ApiError(verb, path, 0, type(err).__name__, str(err) or repr(err)) from err
        raw = response.response
        if 200 <= response.status < 300:
            return raw
        try:
            data = raw.data
        except Exception:  # the body of an error is best effort
            data = b""
        finally:
            raw.release_conn()
        raise _error_from(verb, path, response.status, data)

    def _json(
        self, verb: str, path: str, query: Sequence[tuple[str, str]] = (), body: Any = None
    ) -> Any:
        raw = self._send(verb, path, query, body)
        try:
            data = raw.data
        except Exception as err:
            raise ApiError(verb, path, 0, type(err).__name__, f"reading the answer: {err}") from err
        finally:
            raw.release_conn()
        try:
            return json.loads(data) if data else {}
        except ValueError as err:
            raise ApiError(verb, path, 0, "BadResponse", f"answer is not JSON: {err}") from err

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
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("fieldSelector", field_selector),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
        ]
        # The server ends the stream after timeout_s; a read that outlives that by far means
        # the connection is dead without a FIN (network partition).
        try:
            raw = self._send("GET", _collection(version), query, timeout=(5.0, timeout_s + 30.0))
        except ApiError as err:
            raise _with_selector(err, field_selector) from err
        return _HttpWatchStream(raw, version, _collection(version))

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
        answer = self._json("DELETE", _item(version, name), (), body)
        # resourceslices answer with the deleted object, its resourceVersion the deletion's.
        rv = answer.get("metadata", {}).get("resourceVersion") if answer.get("spec") else None
        return rv if isinstance(rv, str) else None


class _HttpWatchStream:
    """Watch events read line by line from a chunked HTTP answer."""

    def __init__(self, raw: Any, version: str, path: str) -> None:
        self._raw = raw
        self._version = version
        self._path = path
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = bytearray()
        try:
            for chunk in self._raw.stream(amt=None, decode_content=False):
                buffer.extend(chunk)
                while (end := buffer.find(b"\n")) != -1:
                    line = bytes(buffer[:end]).strip()
                    del buffer[: end + 1]
                    if line:
                        yield self._event(line)
        except ApiError:
            raise
        except Exception as err:
            if self._closed:
                return
            raise ApiError("WATCH", self._path, 0, type(err).__name__, str(err)) from err
        finally:
            self.close()

    def _event(self, line: bytes) -> WatchEvent:
        try:
            data = json.loads(line)
        except ValueError as err:
            raise ApiError("WATCH", self._path, 0, "BadResponse", f"bad event: {err}") from err
        kind = data.get("type")
        obj = data.get("object") or {}
        if kind == "ERROR":
            raise _error_from("WATCH", self._path, int(obj.get("code") or 0), json.dumps(obj))
        if kind == "BOOKMARK":
            return WatchEvent("BOOKMARK", obj)
        return WatchEvent(str(kind), from_wire(obj, self._version))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # shutdown() unblocks a read in another thread; close() alone would not.
        try:
            if hasattr(self._raw, "shutdown"):
                self._raw.shutdown()
            else:  # older urllib3
                sock = getattr(getattr(self._raw, "connection", None), "sock", None)
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError, RuntimeError):  # already closed or released
            pass
        try:
            self._raw.release_conn()
            self._raw.close()
        except Exception:  # the connection is being thrown away anyway
            pass


def _with_selector(err: ApiError, field_selector: str) -> ApiError:
    """The same error, its path naming the selector (which scope failed, for the operator)."""
    return ApiError(err.verb, f"{err.path}?fieldSelector={field_selector}", err.status,
                    err.reason, err.message, causes=err.causes)


def _error_from(verb: str, path: str, status: int, data: bytes | str) -> ApiError:
    reason, message, causes = "", "", []
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {}
        message = (data.decode(errors="replace") if isinstance(data, bytes) else data)[:500]
    if isinstance(body, Mapping):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or message)
        details = body.get("details") or {}
        for cause in details.get("causes") or [] if isinstance(details, Mapping) else []:
            if isinstance(cause, Mapping):
                causes.append(
                    Cause(
                        str(cause.get("field") or ""),
                        str(cause.get("reason") or ""),
                        str(cause.get("message") or ""),
                    )
                )
        if not status and isinstance(body.get("code"), int):
            status = body["code"]
    return ApiError(
        verb, path, status, reason or "Unknown", message or "no message", causes=causes
    )
