"""``KubeHTTP``'s backend without the ``kubernetes`` package, with ``Credentials``.

Requests and watches go over connections of our own (``agent.kube.keepalive``) when no proxy
is configured: a tenth of urllib3's CPU per request, and urllib3 (about 2 MiB and 50 ms of
imports) never loaded. Every request to a proxied server goes through urllib3.

Files that rotate are read again: token files (projected ServiceAccount tokens are replaced
about hourly) at most once a minute and at once after a 401, as client-go does; client
certificate files when their modification time changes (the kubelet renews its certificate
in place), checked at most once a minute.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.kube.credentials import Credentials, CredentialsError
from agent.kube.transport import KubeHTTP

log = logging.getLogger(__name__)


#: How long a token or certificate file read is trusted before looking again: client-go's
#: cached file token source (a 1 min period less its 10 s leeway), so a rotated projected
#: token is picked up when the official clients pick it up.
RECHECK_S = 50.0


class FileToken:
    """A bearer token read from a file, read again when older than ``recheck_s`` or on demand.

    As client-go's cached file token source: a read that fails or finds the file empty (caught
    mid-rotation) keeps the last good token; before any good read, ``fallback`` (the
    kubeconfig's inline token) is used, and without one the error is raised.
    """

    def __init__(
        self,
        path: str,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
        fallback: str | None = None,
    ) -> None:
        self.path = path
        self._clock = clock
        self._recheck_s = recheck_s
        self._fallback = fallback
        self._lock = threading.Lock()
        self._token = ""
        self._read_at: float | None = None

    def get(self) -> str:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._recheck_s:
                try:
                    text = Path(self.path).read_text(encoding="utf-8", errors="replace")
                    problem = "" if text.strip() else "the file is empty"
                except OSError as err:
                    text, problem = "", err.strerror or type(err).__name__
                if not problem:
                    self._token = text.strip()
                elif not self._token and self._fallback is None:
                    raise OSError(f"token file {self.path}: {problem}")
                else:
                    log.warning("token file not read, the last token stays in use",
                                extra={"path": self.path, "error": problem})
                self._read_at = now
            return self._token or self._fallback or ""

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None


class LeanBackend:
    """``Backend`` with ``Credentials``; rebuilds its pools when certs rotate.

    Two pools, built and rebuilt together: ``pool`` for requests and ``stream_pool`` for long
    answers (watches). A watch holds its connection for minutes; from a shared pool it takes
    the warm connection the requests before it used, and the next request (the first write
    of a publish) pays a new TCP and TLS handshake. Go's client multiplexes both on one
    HTTP/2 connection; here the watch has its own, so request connections stay warm.

    Without a proxy both are ``KeepAlivePool``s on one endpoint (``keepalive`` is True, and
    ``KubeHTTP`` sends requests through ``fetch`` and watches through ``open_stream``); with
    one, both are urllib3 pools.
    """

    #: Most connections open at once for requests: the plugin serves up to 16 prepares at
    #: once, each a GET of its claim (and a status write).
    MAXSIZE = 16
    #: Most watches open at once (the slice controller holds one or two).
    STREAMS = 8

    def __init__(
        self,
        creds: Credentials,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
        *,
        connect: bool = True,
    ) -> None:
        """``connect=False``: the pool (urllib3, ssl, the client certificate loaded) is built
        by ``connect()`` or the first request, not here; ``dra-agent run`` answers the
        kubelet's registration first, then connects, and a bad certificate is still one line
        and exit 1 before anything is published."""
        self.creds = creds
        self._clock = clock
        self._recheck_s = recheck_s
        self._file_token = FileToken(creds.token_file, clock, recheck_s, creds.token) if (
            creds.token_file) else None
        self._lock = threading.Lock()
        self._cert_stamp = self._stamp()
        self._checked_at = clock()
        self.pool: Any = None
        self.stream_pool: Any = None
        #: Requests over our own kept-alive connections (no proxy to go through).
        self.keepalive = not creds.proxy_url
        if connect:
            self.connect()

    @property
    def server(self) -> str:
        return self.creds.server

    def pool_kwargs(self) -> dict[str, Any]:
        """What the urllib3 pool is built with (TLS and proxy settings), for inspection."""
        import ssl

        from urllib3.util.retry import Retry

        # Connection errors are retried once (a pooled connection the server closed); reads
        # never are, so a POST is not sent twice. Redirects are not followed. A 429 or 503
        # with Retry-After comes back as the answer it is (the caller waits as it says):
        # left to urllib3, with status=0, it is "too many 429 error responses", status 0.
        kwargs: dict[str, Any] = {
            "retries": Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0,
                             respect_retry_after_header=False),
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
        self._load_client_cert(ctx)
        return ctx

    def tls_context(self) -> Any:
        """The SSL context of our own connections (``KeepAlivePool``): the CA (the system's
        when none is given, as urllib3), hostname checks (against ``tls-server-name`` when
        set) and the client certificate. Never the urllib3 pools' context: urllib3 turns
        ``check_hostname`` off on a context it is given with ``tls-server-name`` set."""
        import ssl

        creds = self.creds
        if creds.insecure:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            # A CA that does not load raises ssl.SSLError here (urllib3 fails each request
            # with it; so does ``_keepalive_pool``).
            ctx = ssl.create_default_context(
                cafile=creds.ca_file, cadata=creds.ca_data.decode() if creds.ca_data else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if creds.cert_file or creds.cert_data:
            self._load_client_cert(ctx)
        return ctx

    def _load_client_cert(self, ctx: Any) -> None:
        import ssl

        creds = self.creds
        try:
            if creds.cert_file:
                ctx.load_cert_chain(creds.cert_file, creds.key_file or creds.cert_file)
            else:
                assert creds.cert_data is not None
                # ssl only loads key pairs from files: a private directory, removed at once.
                import tempfile  # inline key pairs only (random, shutil's archivers)

                with tempfile.TemporaryDirectory(prefix="dra-agent-tls-") as tmp:
                    cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
                    cert.write_bytes(creds.cert_data)
                    key.touch(0o600)
                    key.write_bytes(creds.key_data or creds.cert_data)
                    ctx.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as err:
            raise CredentialsError(creds.source, f"client certificate: {err}") from err

    def connect(self) -> None:
        """Build the pool now if it is not built; ``CredentialsError`` when TLS material
        cannot be loaded."""
        with self._lock:
            if self.pool is None:
                self.pool, self.stream_pool = self._build_pools()

    def _build_pools(self) -> tuple[Any, Any]:
        """The request pool and the stream pool."""
        if self.keepalive:
            return self._keepalive_pools()
        return self._urllib3_pool(), self._urllib3_pool()

    def _keepalive_pools(self) -> tuple[Any, Any]:
        from agent import __version__
        from agent.kube.keepalive import Endpoint, KeepAlivePool

        creds = self.creds
        tls, broken = None, None
        if creds.server.startswith("https://"):
            import ssl

            try:
                tls = self.tls_context()
            except CredentialsError:  # the client certificate: refused now, as before
                raise
            except (ssl.SSLError, OSError, ValueError) as err:  # the CA: as urllib3, each
                broken = err                                   # request fails with it
        endpoint = Endpoint(creds.server, tls, creds.tls_server_name, broken)
        agent = f"dra-agent/{__version__}"
        return (KeepAlivePool(endpoint, maxsize=self.MAXSIZE, user_agent=agent),
                KeepAlivePool(endpoint, maxsize=self.STREAMS, user_agent=agent))

    def _urllib3_pool(self) -> Any:
        import urllib3

        kwargs = self.pool_kwargs()
        proxy = self.creds.proxy_url
        # Sent to the proxy only (on CONNECT for an https server), as Go's transport does.
        headers = {"Proxy-Authorization": self.creds.proxy_auth} if self.creds.proxy_auth \
            else None

        if proxy:
            return urllib3.ProxyManager(proxy, proxy_headers=headers, **kwargs)
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

    def _current_pool(self, stream: bool = False) -> Any:
        if self.pool is None:
            self.connect()
        if self.creds.cert_file:
            self._check_renewed_cert()
        return self.stream_pool if stream else self.pool

    def _check_renewed_cert(self) -> None:
        with self._lock:
            now = self._clock()
            if now - self._checked_at < self._recheck_s:
                return
            self._checked_at = now
            stamp = self._stamp()
            if stamp == self._cert_stamp or -1.0 in stamp:
                return
            # Renewed certificate: new connections present it; old ones drain.
            old = self.pool
            try:
                self.pool, self.stream_pool = self._build_pools()
                self._cert_stamp = stamp
            except CredentialsError as err:
                # Caught between writing the certificate and its key: the old pair is still
                # valid for a while, look again at the next check.
                log.warning("renewed client certificate not loaded yet",
                            extra={"source": self.creds.source, "error": err.cause})
                return
        if self.keepalive and old is not None:
            old.close()  # idle connections now; those in use when their request ends

    def auth_headers(self) -> dict[str, str]:
        creds = self.creds
        token = self._file_token.get() if self._file_token else creds.token
        if token:
            return {"Authorization": f"Bearer {token}"}
        if creds.username:
            pair = base64.b64encode(f"{creds.username}:{creds.password or ''}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}

    def send(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: Any,
        *,
        stream: bool = False,
    ) -> Any:
        pool = self._current_pool(stream)
        response = pool.request(
            method, self.creds.server + path_and_query, body=body,
            headers={**headers, **self.auth_headers()}, timeout=timeout,
            preload_content=False, redirect=False,
        )  # fmt: skip
        if response.status == 401 and self._file_token is not None:
            self._file_token.invalidate()  # rotated under us: the next request reads it again
        return response

    def fetch(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        """One whole request over the kept-alive pool (``keepalive`` only): a ``RawAnswer``
        of any status; errors as ``KeepAlivePool.request`` raises them."""
        pool = self.pool if self.pool is not None and not self.creds.cert_file else \
            self._current_pool()
        if self._file_token is not None or self.creds.token or self.creds.username:
            headers = {**headers, **self.auth_headers()}
        answer = pool.request(method, path_and_query, headers, body, timeout)
        if answer.status == 401 and self._file_token is not None:
            self._file_token.invalidate()  # rotated under us: the next request reads it again
        return answer

    def open_stream(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        timeout: float | tuple[float, float],
    ) -> Any:
        """A long answer (a watch) over the kept-alive stream pool (``keepalive`` only): a
        ``StreamedAnswer`` of any status, its body unread."""
        pool = self._current_pool(stream=True)
        headers = {**headers, **self.auth_headers()}
        answer = pool.open_stream(method, path_and_query, headers, timeout)
        if answer.status == 401 and self._file_token is not None:
            self._file_token.invalidate()  # rotated under us: the next request reads it again
        return answer

    def close(self) -> None:
        for pool in (self.pool, self.stream_pool):
            if pool is None:
                continue
            if hasattr(pool, "clear"):
                pool.clear()
            else:
                pool.close()


def lean_client(creds: Credentials, clock: Callable[[], float] = time.monotonic, *,
                connect: bool = True) -> KubeHTTP:
    """A ``KubeHTTP`` over ``LeanBackend(creds)``."""
    return KubeHTTP(LeanBackend(creds, clock, connect=connect))
