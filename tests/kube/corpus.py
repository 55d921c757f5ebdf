"""The kubeconfig corpus (tests/data/kubeconfigs/corpus.yaml): cases, benches, outcomes.

A bench is a server (the fast suite's recording TLS server, or a real kube-apiserver), a
recording CONNECT proxy in front of it and the values a case's ``${NAME}`` placeholders get.
``agent_outcome`` runs the agent's own loader (``agent.kube.client.api_client``) on a case and says
what happened in the terms kubectl's recorded answer uses, so the two can be compared.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import string
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.kube.client import KubeConfigError, api_client
from agent.kube.errors import KubeAPIError
from agent.kube.transport import Response

CORPUS = Path(__file__).resolve().parents[1] / "data" / "kubeconfigs" / "corpus.yaml"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
WHOAMI_BODY = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
OUTCOME_KEYS = ("refused", "user", "proxy", "tls", "plain-http", "unreachable")
#: How ssl/urllib3 say the server's certificate did not verify (CA or name).
TLS_FAILURES = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "CertificateError",
                "doesn't match")
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
              "no_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class Case:
    name: str
    answer: dict[str, Any]  # kubectl's recorded answer (OUTCOME_KEYS)
    text: str | None = None
    cluster: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    agent: str | None = None  # what the agent's refusal must name


def load_corpus() -> list[Case]:
    cases = []
    for raw in yaml.safe_load(CORPUS.read_text(encoding="utf-8")):
        answer = dict(raw["kubectl"])
        assert set(answer) <= set(OUTCOME_KEYS), (raw["name"], answer)
        cases.append(Case(
            name=raw["name"], answer=answer, text=raw.get("text"),
            cluster=raw.get("cluster") or {}, user=raw.get("user") or {},
            files=raw.get("files") or {}, env=raw.get("env") or {}, agent=raw.get("agent"),
        ))  # fmt: skip
    return cases


@dataclass
class Bench:
    """Placeholder values, the secrets among them, and how to read who the server saw."""

    values: dict[str, str]
    proxy: RecordingProxy
    #: What the server answered or recorded for one request -> token-a/token-b/cert/basic/...
    identify: Callable[[Response], str]
    #: Outcome names that read the same on this bench (a real server sees Basic as anonymous).
    aliases: dict[str, str] = field(default_factory=dict)
    #: A real server's user names -> identities (for kubectl, which prints the name).
    users: dict[str, str] = field(default_factory=dict)

    @property
    def secrets(self) -> list[str]:
        keys = ("TOKEN_A", "TOKEN_B", "KEY_DATA")
        return [self.values[k] for k in keys] + ["secret-pw", "p:ss", "p%3Ass"]

    def same(self, recorded: Mapping[str, Any], seen: Mapping[str, Any]) -> bool:
        def norm(answer: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(answer)
            if "user" in out:
                out["user"] = self.aliases.get(out["user"], out["user"])
            return out

        want, got = norm(recorded), norm(seen)
        for key in ("refused", "unreachable"):
            if key in want:
                return key in got and want[key] in got[key]
        return want == got


def pem_values(ca_pem: bytes, other_ca_pem: bytes, cert_pem: bytes, key_pem: bytes
               ) -> dict[str, str]:
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    folded = b64(ca_pem)
    return {
        "CA_PEM": ca_pem.decode(), "CA_DATA": b64(ca_pem),
        "CA_DATA_FOLDED": ("\n" + " " * 6).join(
            folded[i:i + 64] for i in range(0, len(folded), 64)),
        "OTHER_CA_DATA": b64(other_ca_pem), "CERT_PEM": cert_pem.decode(),
        "KEY_PEM": key_pem.decode(), "CERT_DATA": b64(cert_pem), "KEY_DATA": b64(key_pem),
    }


def materialize(case: Case, bench: Bench, root: Path) -> tuple[Path, dict[str, str]]:
    """Write the case's files and kubeconfig under ``root``; return it and the environment."""
    root.mkdir(parents=True, exist_ok=True)
    values = {**bench.values, "DIR": str(root)}
    fill = lambda text: string.Template(text).substitute(values)  # noqa: E731
    for name, content in case.files.items():
        path = root / name
        path.write_text(fill(content))
        if name.endswith(".sh"):
            path.chmod(0o755)
    if case.text is not None:
        text = case.text
    else:
        text = yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": case.cluster}],
            "users": [{"name": "u", "user": case.user}],
        }, sort_keys=False)  # fmt: skip
    path = root / "kubeconfig"
    path.write_text(fill(text))
    path.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    env.update({k: fill(v) for k, v in case.env.items()})
    return path, env


def agent_outcome(path: Path, env: Mapping[str, str], bench: Bench) -> dict[str, Any]:
    """The agent's answer to a case, in the corpus's terms (plus ``message`` for a refusal)."""
    bench.proxy.seen.clear()
    try:
        http = api_client(str(path), env=env, home=path.parent)
    except KubeConfigError as err:
        return {"refused": str(err)}
    assert http is not None
    try:
        if http.server.startswith("http://"):
            # No body: a TLS server answers plain http with 400 and closes, and an unread body
            # would turn that into a reset before the answer is read.
            resp = http.request("GET", "/version", timeout=(5.0, 10.0))
        else:
            resp = http.request("POST", WHOAMI, body=WHOAMI_BODY, timeout=(5.0, 10.0))
    except KubeAPIError as err:
        if any(sign in err.message for sign in TLS_FAILURES):
            return {"tls": "failed"}
        return {"unreachable": err.message}
    finally:
        http.close()
    if resp.status == 400 and b"HTTP request to an HTTPS server" in resp.body:
        return {"plain-http": True}
    out: dict[str, Any] = {"user": bench.identify(resp)}
    if out["user"] == "plain-http":
        out = {"plain-http": True}
    if bench.proxy.seen:
        out["proxy"] = bench.proxy.seen[-1] or "anonymous"
    return out


class RecordingProxy:
    """An HTTP CONNECT proxy on loopback that records each tunnel's Proxy-Authorization and
    connects every target to ``upstream`` (so names only it resolves reach the server)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen: list[str | None] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            if not lines[0].startswith("CONNECT "):
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            auth = next((line.split(":", 1)[1].strip() for line in lines[1:]
                         if line.lower().startswith("proxy-authorization:")), None)
            self.seen.append(auth)
            with socket.create_connection(self.upstream) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                pump = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
                pump.start()
                _pipe(conn, upstream)
                pump.join(5)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def whoami_user(resp: Response, users: Mapping[str, str]) -> str:
    """A real server's SelfSubjectReview answer as a corpus identity (403: anonymous)."""
    if resp.status == 403:
        return "anonymous"
    if resp.status == 401:
        return "unauthorized"
    resp.raise_for_status()
    name = str(resp.json()["status"]["userInfo"]["username"])
    return users.get(name, name)


def iter_secrets_in(text: str, bench: Bench) -> Iterator[str]:
    for secret in bench.secrets:
        if secret and secret in text:
            yield secret


def dumps(answer: Mapping[str, Any]) -> str:
    """An answer as the corpus writes it, for a failure message to paste from."""
    return "kubectl: " + json.dumps(dict(answer))
