"""A pod's credentials: the service's address from the environment, the mounted token."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agent.kube.credentials import Credentials, CredentialsError
from agent.kube.proxy import proxy_for


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
    proxy_url, proxy_auth = proxy_for(None, server, env, "in-cluster", source)
    return Credentials(
        server=server, source=source, ca_file=str(ca), token_file=str(token),
        proxy_url=proxy_url, proxy_auth=proxy_auth,
    )  # fmt: skip
