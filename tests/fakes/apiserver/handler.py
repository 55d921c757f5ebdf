"""The HTTP layer: request parsing, routing to the registry, JSON and chunked watch answers."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from . import discovery
from .errors import APIError, bad_request
from .registry import Request
from .resources import RESOURCE_GROUP, Route, parse_resource_path
from .watch import WatchStream

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)
MAX_BODY = 3 * 1024 * 1024  # server/config.go MaxRequestBodyBytes


def classify(method: str, route: Route | None, params: dict[str, str]) -> str:
    """The Kubernetes verb of a request (what RBAC and audit logs would call it)."""
    if route is None:
        return method.lower()
    if method == "GET":
        if route.watch_path or params.get("watch", "").lower() in ("1", "true"):
            return "watch"
        return "get" if route.name else "list"
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


class APIServerHTTP(ThreadingHTTPServer):
    """Tracks open connections so stop/restart can cut them, as a dying server would."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        self.engine = engine
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, APIRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (reset, broken pipe) is normal for a server; say so quietly.
        log.debug("connection from %s ended: %s", client_address, traceback.format_exc())

    def cut_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class APIRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Keep-alive connections with Nagle on hold each small answer ~40 ms (delayed ACK); a real
    # API server (Go's net/http) sets TCP_NODELAY too, and latency benchmarks depend on it.
    disable_nagle_algorithm = True
    server: APIServerHTTP
    server_version = "fake-kube-apiserver"
    _pending_record: tuple[str, str, str, dict[str, str]] | None = None

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- answers -------------------------------------------------------------------------------

    def _send_json(
        self,
        code: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        warnings: list[str] | None = None,
    ) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        # Record before answering: a client that sees the answer also sees the record.
        self._record(code)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for text in warnings or []:
            quoted = text.replace("\\", "\\\\").replace('"', '\\"')
            self.send_header("Warning", f'299 - "{quoted}"')
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _record(self, status: int) -> None:
        pending, self._pending_record = self._pending_record, None
        if pending is not None:
            verb, method, path, params = pending
            self.server.engine.record(verb, method, path, status, params)

    # WatchSink
    def start_stream(self) -> None:
        # Record a watch when it starts: a long stream is part of the count while it runs.
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json;stream=watch")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def send_event(self, event: dict[str, Any]) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def client_gone(self) -> bool:
        """A watch client that closed its end: the socket reads EOF without blocking."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # -- dispatch ------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            raise APIError(413, f"the request body is too large: limit is {MAX_BODY}")
        return self.rfile.read(length) if length else b""

    def _handle(self, method: str) -> None:
        engine = self.server.engine
        split = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        parts = [p for p in split.path.split("/") if p != ""]
        route = parse_resource_path(parts, engine.resources, engine.served_versions)
        verb = classify(method, route, params)
        self._pending_record = (verb, method, split.path, params)
        status = 500
        try:
            body = self._read_body()
            engine.before_request(verb, method, split.path)
            if route is None:
                status, payload = self._non_resource(method, parts)
                self._send_json(status, payload)
                return
            req = Request(
                route,
                params,
                self.headers.get("User-Agent", ""),
                self.headers.get("Content-Type", ""),
            )
            if verb == "watch":
                status = 200
                engine.track_watch(+1)
                try:
                    WatchStream(engine.registry, req, self, engine, engine.watch_settings).run()
                finally:
                    engine.track_watch(-1)
                return
            status, payload, warnings = self._resource(verb, req, body)
            self._send_json(status, payload, warnings=warnings)
        except APIError as e:
            status = e.code
            self._send_json(e.code, e.status(), headers=e.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug in the fake must still answer like a server would
            log.error("fake apiserver internal error: %s\n%s", e, traceback.format_exc())
            status = 500
            try:
                self._send_json(500, APIError(500, f"fake apiserver bug: {e!r}").status())
            except OSError:
                self.close_connection = True
        finally:
            self._record(status)

    def _non_resource(self, method: str, parts: list[str]) -> tuple[int, Any]:
        engine = self.server.engine
        if method != "GET":
            raise APIError(405, "the server does not allow this method on the requested resource")
        path = "/" + "/".join(parts)
        if path == "/api":
            return 200, discovery.api_versions(self.headers.get("Host", ""))
        if path == "/api/v1":
            return 200, discovery.resource_list("", "v1", engine.resources)
        if path == "/apis":
            return 200, discovery.api_group_list(engine.served_versions)
        if path == f"/apis/{RESOURCE_GROUP}" and engine.served_versions:
            return 200, discovery.api_group(engine.served_versions)
        if (
            len(parts) == 3
            and parts[:2] == ["apis", RESOURCE_GROUP]
            and parts[2] in engine.served_versions
        ):
            return 200, discovery.resource_list(RESOURCE_GROUP, parts[2], engine.resources)
        if path == "/version":
            return 200, discovery.version_info()
        if path in ("/healthz", "/readyz", "/livez"):
            return 200, "ok"
        raise APIError(
            404,
            "the server could not find the requested resource",
            details={
                "causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]
            },
        )

    def _resource(self, verb: str, req: Request, body: bytes) -> tuple[int, Any, list[str]]:
        engine = self.server.engine
        reg, writer = engine.registry, engine.writer
        if req.route.rtype.namespaced and req.route.namespace is None and verb != "list":
            # The all-namespaces path serves list and watch only.
            raise APIError(405, "the server does not allow this method on the requested resource")
        if verb == "get":
            return 200, reg.get(req), []
        if verb == "list":
            return 200, reg.list(req), []
        if verb == "patch" and req.route.name:
            return writer.patch(req, body)
        if verb in ("create", "update", "delete", "deletecollection"):
            if verb in ("create", "update"):
                _check_body_type(req.content_type)
            parsed = _json_body(body, required=verb in ("create", "update"))
            scoped = req.route.namespace is not None or not req.route.rtype.namespaced
            if verb == "create" and req.route.name is None and scoped:
                return writer.create(req, parsed)
            if verb == "update" and req.route.name:
                return writer.update(req, parsed)
            options = parsed if isinstance(parsed, dict) else {}
            if verb == "delete":
                code, obj = reg.delete(req, options)
                return code, obj, []
            if verb == "deletecollection" and req.route.subresource is None:
                return 200, reg.delete_collection(req, options), []
        raise APIError(405, "the server does not allow this method on the requested resource")


#: The serializers a create or update body may use (NegotiateInputSerializer); the fake decodes
#: only JSON, but answers 415 for any other type just as the real server does.
BODY_TYPES = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf")


def _check_body_type(content_type: str) -> None:
    ctype = content_type.split(";", maxsplit=1)[0].strip() or "application/json"
    if ctype not in BODY_TYPES:
        raise APIError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(BODY_TYPES),
        )


def _json_body(body: bytes, required: bool) -> Any:
    if not body:
        if required:
            raise bad_request("the body of the request was empty")
        return None
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body of the request was in an unknown format: {e}") from None
