"""A recording HTTP(S) server and a small PKI made with the openssl CLI, for the transport."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_cn: str | None
    client_port: int = 0  # which connection it came on


@dataclass
class Answer:
    status: int = 200
    body: bytes = b'{"kind":"Echo"}'
    content_type: str = "application/json"


@dataclass
class EchoServer:
    """Answers every request with ``answers`` in turn (then the default) and records it."""

    httpd: ThreadingHTTPServer
    scheme: str
    seen: list[Seen] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}"

    def last_auth(self) -> str | None:
        return self.seen[-1].headers.get("authorization")


def _handler(server: EchoServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            cn = None
            peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) \
                else None
            for rdn in (peer or {}).get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
            server.seen.append(Seen(self.command, self.path,
                                    {k.lower(): v for k, v in self.headers.items()}, body, cn,
                                    int(self.client_address[1])))
            answer = server.answers.pop(0) if server.answers else Answer()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815 (http.server names)

    return Handler


def _serve(ctx: ssl.SSLContext | None) -> Iterator[EchoServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    httpd.daemon_threads = True
    if ctx is not None:
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    server = EchoServer(httpd, "https" if ctx else "http")
    httpd.RequestHandlerClass = _handler(server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    """A plain-http recording server."""
    yield from _serve(None)


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for ``kube.test``/127.0.0.1 and two client certificates."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path

    def client(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                 "-subj", f"/CN={ca}", cwd=d)
    _signed(d, "server", "/CN=kube-apiserver",
            "subjectAltName=DNS:kube.test,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    for client in ("node-a", "node-b"):
        _signed(d, client, f"/CN=system:node:{client}", "extendedKeyUsage=clientAuth\n")
    return Pki(d, d / "ca.crt", d / "server.crt", d / "server.key", d / "other-ca.crt")


@pytest.fixture
def tls_echo(pki: Pki) -> Iterator[EchoServer]:
    """An https recording server; it asks for (but does not require) a client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    yield from _serve(ctx)


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    """Write a one-context kubeconfig (JSON is YAML)."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(json.dumps(doc))
    return path


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
