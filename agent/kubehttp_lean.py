"""Credentials for ``KubeHTTP`` without the ``kubernetes`` package: kubeconfig and in-cluster.

What is implemented is what nodes use: a kubeconfig's current context with server, CA (file or
data), client certificate and key (file or data; the kubelet's own kubeconfig points at
``/var/lib/kubelet/pki/kubelet-client-current.pem``), token or tokenFile, basic auth,
``insecure-skip-tls-verify``, ``tls-server-name`` and an http(s) ``proxy-url``; and a pod's
ServiceAccount mount. Anything else (exec plugins, auth providers, SOCKS proxies) raises
``NeedsOfficialLoaderError`` so ``agent.kube`` falls back to the official loader.

Files that rotate are read again: token files (projected ServiceAccount tokens are replaced
about hourly) at most once a minute and at once after a 401, as client-go does; client
certificate files when their modification time changes (the kubelet renews its certificate
in place), checked at most once a minute.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.kubehttp import KubeHTTP

log = logging.getLogger(__name__)

#: How long a token or certificate file read is trusted before looking again.
RECHECK_S = 60.0


class CredentialsError(ValueError):
    """The credentials cannot be used as written (``source`` says where they came from)."""

    def __init__(self, source: str, cause: str) -> None:
        super().__init__(cause)
        self.source = source
        self.cause = cause


class NeedsOfficialLoaderError(CredentialsError):
    """The kubeconfig needs something only the official loader does (exec, auth-provider)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Everything needed to reach and authenticate to one API server."""

    server: str
    source: str = ""
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    # Secrets stay out of repr(): a Credentials in a log line or a traceback leaks nothing.
    key_data: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None


def load_in_cluster(env: Mapping[str, str], service_account_dir: Path) -> Credentials:
    """A pod's credentials: the service's address from the environment, the mounted token."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    source = "in-cluster"
    if not host or not port:
        raise CredentialsError(source, "KUBERNETES_SERVICE_HOST/PORT are not set")
    token = service_account_dir / "token"
    ca = service_account_dir / "ca.crt"
    for path in (token, ca):
        if not path.is_file():
            raise CredentialsError(source, f"{path} is missing")
    if not token.read_text().strip():
        raise CredentialsError(source, f"{token} is empty")
    server_host = f"[{host}]" if ":" in host else host  # IPv6 service addresses
    return Credentials(
        server=f"https://{server_host}:{port}", source=source, ca_file=str(ca),
        token_file=str(token),
    )  # fmt: skip


def load_kubeconfig(path: Path, context: str | None = None) -> Credentials:
    """The current (or named) context's cluster and user from the kubeconfig at ``path``."""
    import yaml

    source = f"kubeconfig {path}"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise CredentialsError(source, f"cannot read it: {err}") from err
    if not isinstance(doc, Mapping):
        raise CredentialsError(source, "not a kubeconfig (no mapping at the top)")
    name = context or doc.get("current-context") or ""
    if not name:
        raise CredentialsError(source, "no current-context is set")
    ctx = _named(doc, "contexts", "context", str(name), source)
    cluster = _named(doc, "clusters", "cluster", str(ctx.get("cluster") or ""), source)
    user_name = str(ctx.get("user") or "")
    user = _named(doc, "users", "user", user_name, source) if user_name else {}
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise NeedsOfficialLoaderError(source, f"user {user_name!r} uses {unsupported}")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise CredentialsError(source, f"cluster server {server!r} is not an http(s) URL")
    proxy = str(cluster.get("proxy-url") or "") or None
    if proxy and not proxy.startswith(("http://", "https://")):
        raise NeedsOfficialLoaderError(source, f"proxy-url {proxy!r} is not an http(s) proxy")
    base = path.parent

    def file(section: Mapping[str, Any], key: str) -> str | None:
        # Relative paths are relative to the kubeconfig's own directory, as for kubectl.
        value = section.get(key)
        return str(base / Path(str(value)).expanduser()) if value else None

    return Credentials(
        server=server,
        source=source,
        ca_file=file(cluster, "certificate-authority"),
        ca_data=_data(cluster, "certificate-authority-data", source),
        cert_file=file(user, "client-certificate"),
        key_file=file(user, "client-key"),
        cert_data=_data(user, "client-certificate-data", source),
        key_data=_data(user, "client-key-data", source),
        token=str(user.get("token") or "") or None,
        token_file=file(user, "tokenFile"),
        username=str(user.get("username") or "") or None,
        password=str(user.get("password") or "") or None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=str(cluster.get("tls-server-name") or "") or None,
        proxy_url=proxy,
    )


def _named(doc: Mapping[str, Any], section: str, key: str, name: str, source: str) -> Any:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, Mapping):
                raise CredentialsError(source, f"{section} entry {name!r} is not a mapping")
            return value
    raise CredentialsError(source, f"no {key} named {name!r} in {section}")


def _data(section: Mapping[str, Any], key: str, source: str) -> bytes | None:
    value = section.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as err:
        raise CredentialsError(source, f"{key} is not base64: {err}") from err


class FileToken:
    """A bearer token read from a file, read again when older than ``recheck_s`` or on demand."""

    def __init__(
        self, path: str, clock: Callable[[], float] = time.monotonic, recheck_s: float = RECHECK_S
    ) -> None:
        self.path = path
        self._clock = clock
        self._recheck_s = recheck_s
        self._lock = threading.Lock()
        self._token = ""
        self._read_at: float | None = None

    def get(self) -> str:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._recheck_s:
                try:
                    self._token = Path(self.path).read_text().strip()
                except OSError:
                    if self._read_at is None:
                        raise
                    # Mid-rotation (file replaced): keep the last token, try again next time.
                self._read_at = now
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None


class LeanBackend:
    """``Backend`` over urllib3 with ``Credentials``; rebuilds its pool when certs rotate."""

    def __init__(
        self,
        creds: Credentials,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.creds = creds
        self._clock = clock
        self._recheck_s = recheck_s
        self._file_token = FileToken(creds.token_file, clock, recheck_s) if (
            creds.token_file and not creds.token) else None
        self._lock = threading.Lock()
        self._cert_stamp = self._stamp()
        self._checked_at = clock()
        self.pool = self._build_pool()

    @property
    def server(self) -> str:
        return self.creds.server

    def pool_kwargs(self) -> dict[str, Any]:
        """What the urllib3 pool is built with (TLS and proxy settings), for inspection."""
        import ssl

        from urllib3.util.retry import Retry

        # Connection errors are retried once (a pooled connection the server closed); reads
        # never are, so a POST is not sent twice. Redirects are not followed.
        kwargs: dict[str, Any] = {
            "retries": Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0),
            "maxsize": 4,
        }
        creds = self.creds
        if not creds.server.startswith("https://"):
            return kwargs
        if creds.insecure:
            kwargs["cert_reqs"] = ssl.CERT_NONE
        else:
            kwargs["cert_reqs"] = ssl.CERT_REQUIRED
            if creds.ca_file:
                kwargs["ca_certs"] = creds.ca_file
            if creds.ca_data:
                kwargs["ca_cert_data"] = creds.ca_data.decode()
        if creds.tls_server_name:
            kwargs["server_hostname"] = creds.tls_server_name
            kwargs["assert_hostname"] = creds.tls_server_name
        if creds.cert_file or creds.cert_data:
            kwargs["ssl_context"] = self._client_cert_context(kwargs)
        return kwargs

    def _client_cert_context(self, kwargs: dict[str, Any]) -> Any:
        """An SSL context holding the client certificate (in-memory data via a private file)."""
        import ssl

        ctx = ssl.create_default_context(
            cafile=kwargs.get("ca_certs"), cadata=kwargs.get("ca_cert_data")
        )
        if kwargs["cert_reqs"] == ssl.CERT_NONE:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        creds = self.creds
        try:
            if creds.cert_file:
                ctx.load_cert_chain(creds.cert_file, creds.key_file or creds.cert_file)
            else:
                assert creds.cert_data is not None
                # ssl only loads key pairs from files: a private directory, removed at once.
                with tempfile.TemporaryDirectory(prefix="dra-agent-tls-") as tmp:
                    cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
                    cert.write_bytes(creds.cert_data)
                    key.touch(0o600)
                    key.write_bytes(creds.key_data or creds.cert_data)
                    ctx.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as err:
            raise CredentialsError(creds.source, f"client certificate: {err}") from err
        return ctx

    def _build_pool(self) -> Any:
        import urllib3

        kwargs = self.pool_kwargs()
        if self.creds.proxy_url:
            return urllib3.ProxyManager(self.creds.proxy_url, **kwargs)
        return urllib3.PoolManager(**kwargs)

    def _stamp(self) -> tuple[float, ...]:
        stamps: list[float] = []
        for name in (self.creds.cert_file, self.creds.key_file):
            if name:
                try:
                    stamps.append(os.stat(name).st_mtime)
                except OSError:
                    stamps.append(-1.0)
        return tuple(stamps)

    def _current_pool(self) -> Any:
        if not self.creds.cert_file:
            return self.pool
        with self._lock:
            now = self._clock()
            if now - self._checked_at >= self._recheck_s:
                self._checked_at = now
                stamp = self._stamp()
                if stamp != self._cert_stamp and -1.0 not in stamp:
                    # Renewed certificate: new connections present it; old ones drain.
                    try:
                        self.pool = self._build_pool()
                        self._cert_stamp = stamp
                    except CredentialsError as err:
                        # Caught between writing the certificate and its key: the old pair
                        # is still valid for a while, look again at the next check.
                        log.warning("renewed client certificate not loaded yet",
                                    extra={"source": self.creds.source, "error": err.cause})
            return self.pool

    def auth_headers(self) -> dict[str, str]:
        creds = self.creds
        token = creds.token or (self._file_token.get() if self._file_token else None)
        if token:
            return {"Authorization": f"Bearer {token}"}
        if creds.username is not None and creds.password is not None:
            pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}

    def send(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: Any,
    ) -> Any:
        pool = self._current_pool()
        response = pool.request(
            method, self.creds.server + path_and_query, body=body,
            headers={**headers, **self.auth_headers()}, timeout=timeout,
            preload_content=False, redirect=False,
        )  # fmt: skip
        if response.status == 401 and self._file_token is not None:
            self._file_token.invalidate()  # rotated under us: the next request reads it again
        return response

    def close(self) -> None:
        self.pool.clear()


def lean_client(creds: Credentials, clock: Callable[[], float] = time.monotonic) -> KubeHTTP:
    """A ``KubeHTTP`` over ``LeanBackend(creds)``."""
    return KubeHTTP(LeanBackend(creds, clock))
