"""The proxy an API server is reached through: a kubeconfig's ``proxy-url`` or the
environment (HTTPS_PROXY/HTTP_PROXY/NO_PROXY), read as Go's ``net/http`` and client-go read them.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from agent.kube.credentials import CredentialsError, NeedsOfficialLoaderError


def proxy_for(
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
