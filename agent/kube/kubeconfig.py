"""Credentials from a kubeconfig file, read without the ``kubernetes`` package.

What is implemented is what nodes use: a kubeconfig's current context with server, CA (file or
data), client certificate and key (file or data; the kubelet's own kubeconfig points at
``/var/lib/kubelet/pki/kubelet-client-current.pem``), token and/or tokenFile, basic auth,
``insecure-skip-tls-verify``, ``tls-server-name``, an http(s) ``proxy-url`` (its userinfo sent
as Proxy-Authorization) or HTTPS_PROXY/NO_PROXY. Exec plugins, auth providers and SOCKS proxies
raise ``NeedsOfficialLoaderError`` so ``agent.kube.client`` falls back to the official loader.

The file is read as client-go reads it, so the agent accepts, refuses and connects as kubectl
does (tests/data/kubeconfigs/corpus.yaml holds kubectl's recorded answers): fields typed as in
client-go's api/v1 (``insecure-skip-tls-verify: "false"`` is refused, not read as true),
conflicting fields refused (a CA with the insecure flag, CA file and data, two auth methods),
no credentials to a plain-http server. Errors name the file, section and field, never a value.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agent.common.k8snames import dns_label_problem
from agent.kube.credentials import Credentials, CredentialsError, NeedsOfficialLoaderError
from agent.kube.proxy import proxy_for


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
        if not value:
            return None
        full = str(base / value)
        try:
            # A NUL or an unpaired surrogate (YAML's "\ud800") names no file: open() would
            # raise ValueError, not OSError.
            if "\0" in full:
                raise ValueError
            os.fsencode(full)
        except ValueError:
            raise CredentialsError(source, f"{key} {value!a} is not a usable file "
                                   "path") from None
        return full

    where_c, where_u = f"cluster {cluster_name!r}", f"user {user_name!r}"
    server = _server_url(str(cluster.get("server") or ""), where_c, source)
    proxy_url, proxy_auth = proxy_for(cluster.get("proxy-url"), server, env or {}, where_c, source)
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
    try:
        creds = _user(user, where_u, file, source)
    except NeedsOfficialLoaderError as err:
        # The official loader copies proxy-url alone (its userinfo lost) and reads the proxy
        # environment by Python's rules: it gets the proxy decided here instead.
        err.proxy_resolved, err.proxy_url, err.proxy_auth = True, proxy_url, proxy_auth
        raise
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
