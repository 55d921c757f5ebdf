"""What the agent connects to an API server with, and the errors of loading it.

Loaded from a kubeconfig (``agent.kube.kubeconfig``) or a pod's ServiceAccount mount
(``agent.kube.incluster``) without the ``kubernetes`` package; used by ``agent.kube.lean``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class CredentialsError(ValueError):
    """The credentials cannot be used as written (``source`` says where they came from)."""

    def __init__(self, source: str, cause: str) -> None:
        super().__init__(cause)
        self.source = source
        self.cause = cause


class NeedsOfficialLoaderError(CredentialsError):
    """The kubeconfig needs something only the official loader does (exec, auth-provider).

    ``proxy_resolved`` is set once the lean parse has decided the cluster's proxy (proxy-url,
    else HTTPS_PROXY/HTTP_PROXY/NO_PROXY as Go reads them): ``proxy_url`` (without userinfo,
    None for a direct connection) and ``proxy_auth`` (its Proxy-Authorization), for the
    official client to use instead of what it would make of them.
    """

    def __init__(self, source: str, cause: str) -> None:
        super().__init__(source, cause)
        self.proxy_resolved = False
        self.proxy_url: str | None = None
        self.proxy_auth: str | None = None

    def __repr__(self) -> str:  # never the proxy's credentials
        return f"{type(self).__name__}({self.source!r}, {self.cause!r})"


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
    #: Preferred over ``token`` whenever it can be read (client-go's order); ``token`` is the
    #: fallback while it cannot.
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure: bool = False
    tls_server_name: str | None = None
    #: Without userinfo; that is in ``proxy_auth`` (a Proxy-Authorization value).
    proxy_url: str | None = None
    proxy_auth: str | None = field(default=None, repr=False)
