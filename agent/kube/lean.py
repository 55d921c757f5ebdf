"""Credentials for ``KubeHTTP`` without the ``kubernetes`` package: kubeconfig and in-cluster.

What is implemented is what nodes use: a kubeconfig's current context with server, CA (file or
data), client certificate and key (file or data; the kubelet's own kubeconfig points at
``/var/lib/kubelet/pki/kubelet-client-current.pem``), token and/or tokenFile, basic auth,
``insecure-skip-tls-verify``, ``tls-server-name``, an http(s) ``proxy-url`` (its userinfo sent
as Proxy-Authorization) or HTTPS_PROXY/NO_PROXY; and a pod's ServiceAccount mount. Exec
plugins, auth providers and SOCKS proxies raise ``NeedsOfficialLoaderError`` so
``agent.kube.client`` falls back to the official loader.

The file is read as client-go reads it, so the agent accepts, refuses and connects as kubectl
does (tests/data/kubeconfigs/corpus.yaml holds kubectl's recorded answers): fields typed as in
client-go's api/v1 (``insecure-skip-tls-verify: "false"`` is refused, not read as true),
conflicting fields refused (a CA with the insecure flag, CA file and data, two auth methods),
no credentials to a plain-http server. Errors name the file, section and field, never a value.

Files that rotate are read again: token files (projected ServiceAccount tokens are replaced
about hourly) at most once a minute and at once after a 401, as client-go does; client
certificate files when their modification time changes (the kubelet renews its certificate
in place), checked at most once a minute.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from agent.common.k8snames import dns_label_problem
from agent.kube.transport import KubeHTTP

log = logging.getLogger(__name__)

#: How long a token or certificate file read is trusted before looking again: client-go's
#: cached file token source (a 1 min period less its 10 s leeway), so a rotated projected
#: token is picked up when the official clients pick it up.
RECHECK_S = 50.0


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
    server = f"https://{server_host}:{port}"
    # client-go's in-cluster config has no proxy of its own: the environment's applies.
    proxy_url, proxy_auth = _proxy(None, server, env, "in-cluster", source)
    return Credentials(
        server=server, source=source, ca_file=str(ca), token_file=str(token),
        proxy_url=proxy_url, proxy_auth=proxy_auth,
    )  # fmt: skip


def load_kubeconfig(
    path: Path, context: str | None = None, env: Mapping[str, str] | None = None
) -> Credentials:
    """The current (or named) context's cluster and user from the kubeconfig at ``path``.

    Read as client-go reads it (``clientcmd`` api/v1 types, ``ConfirmUsable``, rest.Config):
    a field of the wrong type, conflicting fields or an unreadable file is refused where
    kubectl refuses, in one line naming the file's section and field and never a secret's
    value. ``env`` supplies HTTPS_PROXY/HTTP_PROXY/NO_PROXY when no ``proxy-url`` is set.
    """
    source = f"kubeconfig {path}"
    doc = _parse(path, source)
    name = context or doc.get("current-context") or ""
    if not name:
        # kubectl falls back to http://localhost:8080 without credentials; a node agent has
        # no use for that and says so instead.
        raise CredentialsError(source, "no current-context is set")
    clusters = _named_section(doc, "clusters", "cluster", _CLUSTER_FIELDS, source)
    users = _named_section(doc, "users", "user", _USER_FIELDS, source)
    contexts = _named_section(doc, "contexts", "context", _CONTEXT_FIELDS, source)
    if name not in contexts:
        raise CredentialsError(source, f"context {name!r} (current-context) is not in contexts")
    ctx = contexts[name]
    cluster_name, user_name = ctx.get("cluster") or "", ctx.get("user") or ""
    where = f"context {name!r}"
    if not cluster_name:
        raise CredentialsError(source, f"{where} names no cluster")
    if not user_name:
        # kubectl then asks for a username on the terminal; a daemon has none.
        raise CredentialsError(source, f"{where} names no user")
    if cluster_name not in clusters:
        raise CredentialsError(source, f"cluster {cluster_name!r} of {where} is not in clusters")
    if user_name not in users:
        raise CredentialsError(source, f"user {user_name!r} of {where} is not in users")
    namespace = ctx.get("namespace")
    if namespace and dns_label_problem(namespace):
        raise CredentialsError(source, f"{where}: namespace is not a DNS label")
    cluster, user = clusters[cluster_name], users[user_name]
    base = path.parent

    def file(section: Mapping[str, Any], key: str) -> str | None:
        # Relative paths are relative to the kubeconfig's directory; no "~" expansion (client-go
        # has none: "~/x" is the directory "~" next to the kubeconfig).
        value = section.get(key)
        return str(base / value) if value else None

    where_c, where_u = f"cluster {cluster_name!r}", f"user {user_name!r}"
    server = _server_url(str(cluster.get("server") or ""), where_c, source)
    proxy_url, proxy_auth = _proxy(cluster.get("proxy-url"), server, env or {}, where_c, source)
    if not server.startswith("https://"):
        # client-go merges no TLS settings and no user credentials for a plain-http server:
        # the token never goes out unencrypted.
        return Credentials(server=server, source=source, proxy_url=proxy_url,
                           proxy_auth=proxy_auth)
    ca_file, ca_data = file(cluster, "certificate-authority"), cluster.get(
        "certificate-authority-data")
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    if ca_file and ca_data:
        raise CredentialsError(source, f"{where_c}: certificate-authority and "
                               "certificate-authority-data are both set (kubectl refuses this)")
    if insecure and (ca_file or ca_data):
        raise CredentialsError(source, f"{where_c}: insecure-skip-tls-verify is true and a "
                               "certificate authority is set (kubectl refuses this)")
    _readable(ca_file, f"{where_c}: certificate-authority", source)
    creds = _user(user, where_u, file, source)
    return Credentials(
        server=server, source=source, ca_file=ca_file, ca_data=ca_data, insecure=insecure,
        tls_server_name=cluster.get("tls-server-name") or None, proxy_url=proxy_url,
        proxy_auth=proxy_auth, **creds,
    )  # fmt: skip


def _parse(path: Path, source: str) -> Mapping[str, Any]:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise CredentialsError(source, f"cannot read it: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise CredentialsError(source, f"not UTF-8 text (byte {err.start})") from err
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        # Never the snippet PyYAML quotes: the broken line may hold a token or a key.
        line = err.problem_mark.line + 1 if err.problem_mark else 0
        raise CredentialsError(source, f"not valid YAML at line {line}: {err.problem}") from err
    except yaml.YAMLError as err:
        raise CredentialsError(source, f"not valid YAML: {type(err).__name__}") from err
    except RecursionError as err:  # PyYAML's composer recurses once per nesting level
        raise CredentialsError(source, "not a kubeconfig: nested too deep to read") from err
    if doc is None:
        doc = {}  # an empty file is an empty Config, as for client-go
    if not isinstance(doc, Mapping):
        raise CredentialsError(source, "not a kubeconfig (no mapping at the top)")
    _check_fields(doc, _CONFIG_FIELDS, "the top level", source)
    if doc.get("apiVersion") not in (None, "", "v1"):
        raise CredentialsError(source, "apiVersion must be v1")
    if doc.get("kind") not in (None, "", "Config"):
        raise CredentialsError(source, "kind must be Config")
    return doc


#: Each field client-go's api/v1 types know, with its JSON type; others are ignored (its
#: decoder is not strict). ``bytes`` fields are base64 strings.
_CONFIG_FIELDS: dict[str, type] = {
    "apiVersion": str, "kind": str, "preferences": dict, "clusters": list, "users": list,
    "contexts": list, "current-context": str, "extensions": list,
}
_CLUSTER_FIELDS: dict[str, type] = {
    "server": str, "tls-server-name": str, "insecure-skip-tls-verify": bool,
    "certificate-authority": str, "certificate-authority-data": bytes, "proxy-url": str,
    "disable-compression": bool, "extensions": list,
}
_USER_FIELDS: dict[str, type] = {
    "client-certificate": str, "client-certificate-data": bytes, "client-key": str,
    "client-key-data": bytes, "token": str, "tokenFile": str, "as": str, "as-uid": str,
    "as-groups": list, "as-user-extra": dict, "username": str, "password": str,
    "auth-provider": dict, "exec": dict, "extensions": list,
}
_CONTEXT_FIELDS: dict[str, type] = {
    "cluster": str, "user": str, "namespace": str, "extensions": list,
}
_TYPE_NAMES = {str: "a string", bool: "a boolean (true or false)", dict: "a mapping",
               list: "a list", bytes: "a base64 string"}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__  # dates and the like: the type, never the value


def _check_fields(
    section: dict[str, Any] | Mapping[str, Any], fields: Mapping[str, type], where: str,
    source: str,
) -> None:
    """Type-check ``section`` in place as Go's JSON decoder would; base64 fields decoded."""
    for key, want in fields.items():
        value = section.get(key)
        if value is None:
            continue  # JSON null leaves a Go field at its zero value
        if want is bytes:
            if not isinstance(value, str):
                raise CredentialsError(source, f"{where}: {key} must be {_TYPE_NAMES[bytes]}, "
                                       f"not {_kind(value)}")
            # encoding/json decodes []byte with StdEncoding, which skips \r and \n.
            raw = value.replace("\n", "").replace("\r", "")
            try:
                decoded = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise CredentialsError(source, f"{where}: {key} is not base64") from None
            if isinstance(section, dict):
                section[key] = decoded
            continue
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is dict:
            ok = isinstance(value, Mapping)
        if not ok:
            raise CredentialsError(source, f"{where}: {key} must be {_TYPE_NAMES[want]}, "
                                   f"not {_kind(value)}")


def _named_section(
    doc: Mapping[str, Any], section: str, key: str, fields: Mapping[str, type], source: str
) -> dict[str, dict[str, Any]]:
    """``clusters``/``users``/``contexts`` by name, every entry checked (as client-go does)."""
    out: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(doc.get(section) or []):
        if not isinstance(entry, Mapping):
            raise CredentialsError(source, f"{section}[{i}] is not a mapping")
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise CredentialsError(source, f"{section}[{i}]: name must be a string, "
                                   f"not {_kind(name)}")
        name = name or ""
        if name in out:
            raise CredentialsError(source, f"{section}: duplicate name {name!r}")
        body = entry.get(key)
        if body is not None and not isinstance(body, Mapping):
            raise CredentialsError(source, f"{section} entry {name!r}: {key} must be a mapping, "
                                   f"not {_kind(body)}")
        checked = dict(body or {})
        _check_fields(checked, fields, f"{section} entry {name!r}", source)
        out[name] = checked
    return out


def _server_url(server: str, where: str, source: str) -> str:
    if not server:
        raise CredentialsError(source, f"{where} has no server")
    try:
        parts = urlsplit(server) if "://" in server else None
        if parts is None or not parts.netloc:
            # client-go's DefaultServerURL: a bare host[:port] is plain http (TLS settings are
            # not merged yet when it decides).
            parts = urlsplit("http://" + server)
            if parts.path not in ("", "/"):
                raise CredentialsError(source, f"{where}: server must be a URL or a host:port "
                                       "pair")
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as err:
        raise CredentialsError(source, f"{where}: server is not a valid URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CredentialsError(source, f"{where}: server is not an http(s) URL")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _readable(name: str | None, what: str, source: str) -> None:
    if not name:
        return
    try:
        with open(name, "rb"):
            pass
    except OSError as err:
        raise CredentialsError(source, f"{what} {name}: {err.strerror or err}") from err


def _user(
    user: Mapping[str, Any], where: str, file: Callable[[Mapping[str, Any], str], str | None],
    source: str,
) -> dict[str, Any]:
    """The user's credentials as Credentials fields, refused where ConfirmUsable refuses."""
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported) is not None:
            _check_plugin(user, where, source)
            raise NeedsOfficialLoaderError(source, f"{where} uses {unsupported}")
    cert_file, key_file = file(user, "client-certificate"), file(user, "client-key")
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if cert_file or cert_data:
        if cert_file and cert_data:
            raise CredentialsError(source, f"{where}: client-certificate and "
                                   "client-certificate-data are both set (kubectl refuses this)")
        if key_file and key_data:
            raise CredentialsError(source, f"{where}: client-key and client-key-data are both "
                                   "set (kubectl refuses this)")
        if not key_file and not key_data:
            raise CredentialsError(source, f"{where}: client-certificate without client-key")
        _readable(cert_file, f"{where}: client-certificate", source)
        _readable(key_file, f"{where}: client-key", source)
    else:
        # A key without a certificate is ignored by client-go, as here.
        key_file = key_data = None
    token, token_file = user.get("token") or None, file(user, "tokenFile")
    username, password = user.get("username") or None, user.get("password") or None
    if (username or password) and (token or token_file):
        raise CredentialsError(source, f"{where}: a token and a username/password are both "
                               "set; only one authentication method is allowed")
    if token_file and not token:
        # Read now, as client-go does: a missing or empty file is refused at start; with an
        # inline token as well, that token is used while the file cannot be read.
        try:
            text = Path(token_file).read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise CredentialsError(source, f"{where}: tokenFile {token_file}: "
                                   f"{err.strerror or err}") from err
        if not text.strip():
            raise CredentialsError(source, f"{where}: tokenFile {token_file} is empty")
    return {
        "cert_file": cert_file, "key_file": key_file, "cert_data": cert_data,
        "key_data": key_data, "token": token, "token_file": token_file,
        # client-go sends Basic whenever a username is set, an empty password included.
        "username": username, "password": (password or "") if username else None,
    }


_INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")


def _check_plugin(user: Mapping[str, Any], where: str, source: str) -> None:
    """What client-go's validation asks of an exec plugin before the official loader runs it."""
    plugin = user.get("exec")
    if plugin is None:
        return
    if user.get("auth-provider") is not None:
        raise CredentialsError(source, f"{where}: exec and auth-provider are both set")
    if not plugin.get("command"):
        raise CredentialsError(source, f"{where}: exec has no command")
    api_version = plugin.get("apiVersion")
    if not api_version:
        raise CredentialsError(source, f"{where}: exec has no apiVersion")
    mode = plugin.get("interactiveMode")
    if not mode and api_version not in ("client.authentication.k8s.io/v1beta1",
                                        "client.authentication.k8s.io/v1alpha1"):
        raise CredentialsError(source, f"{where}: exec has no interactiveMode (required for "
                               f"{api_version})")
    if mode and mode not in _INTERACTIVE_MODES:
        raise CredentialsError(source, f"{where}: exec interactiveMode must be one of "
                               f"{', '.join(_INTERACTIVE_MODES)}")


def _proxy(
    value: str | None, server: str, env: Mapping[str, str], where: str, source: str
) -> tuple[str | None, str | None]:
    """The proxy URL (without userinfo) and its Proxy-Authorization for ``server``.

    ``proxy-url`` wins; else the environment as Go's ``http.ProxyFromEnvironment`` reads it.
    A URL's userinfo becomes Basic proxy credentials, as Go's transport sends them.
    """
    if value:
        what = f"{where}: proxy-url"
    else:
        value = proxy_from_environment(server, env)
        what = "the proxy in HTTPS_PROXY/HTTP_PROXY"
        if not value:
            return None, None
    if "://" not in value:
        value = "http://" + value  # Go reads "host:port" in the environment as http
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise CredentialsError(source, f"{what} cannot be parsed") from None
    if parts.scheme == "socks5":
        raise NeedsOfficialLoaderError(source, f"{what} is a SOCKS proxy")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Never the URL itself: it may carry a password.
        raise CredentialsError(source, f"{what} must be an http, https or socks5 URL")
    auth = None
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, "", "", "")), auth


def proxy_from_environment(server: str, env: Mapping[str, str]) -> str | None:
    """The proxy Go's ``httpproxy.FromEnvironment`` picks for ``server``, or None.

    HTTPS_PROXY (https) or HTTP_PROXY (http), upper case first; never for localhost or a
    loopback address; NO_PROXY entries are ``*``, IPs, CIDRs or domains (``a.b`` matches a.b
    and its subdomains, ``.a.b`` only subdomains), each optionally with ``:port``.
    """
    parts = urlsplit(server)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    names = ("HTTPS_PROXY", "https_proxy") if parts.scheme == "https" else (
        "HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), "")
    if not proxy or host == "localhost":
        return None
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.is_loopback:
        return None
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry and _no_proxy_matches(entry, host, str(port), ip):
            return None
    return proxy


def _no_proxy_matches(
    entry: str, host: str, port: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
) -> bool:
    if entry == "*":
        return True
    if "/" in entry:
        try:
            return ip is not None and ip in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    name, want_port = _split_host_port(entry)
    try:
        entry_ip = ipaddress.ip_address(name)
    except ValueError:
        entry_ip = None
    if entry_ip is not None:
        return ip is not None and ip == entry_ip and want_port in ("", port)
    if not name:
        return False
    if name.startswith("*."):
        name = name[1:]
    suffix = name if name.startswith(".") else "." + name
    return (host.endswith(suffix) or host == name) and want_port in ("", port)


def _split_host_port(entry: str) -> tuple[str, str]:
    """Go's net.SplitHostPort where it succeeds ("h:p", "[v6]:p"), else the entry whole."""
    if entry.startswith("[") and "]:" in entry:
        host, _, port = entry[1:].partition("]:")
        return host, port
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""


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
        self._file_token = FileToken(creds.token_file, clock, recheck_s, creds.token) if (
            creds.token_file) else None
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
            # Sent to the proxy only (on CONNECT for an https server), as Go's transport does.
            headers = {"Proxy-Authorization": self.creds.proxy_auth} if self.creds.proxy_auth \
                else None
            return urllib3.ProxyManager(self.creds.proxy_url, proxy_headers=headers, **kwargs)
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
