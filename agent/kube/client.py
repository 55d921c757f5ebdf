"""Build the agent's API server client (a ``KubeHTTP``) from its Config.

Resolution order for ``--kubeconfig`` (DESIGN.md, "Command line"):

* ``none``: no API server; callers get ``None`` and run without one (kubelet standalone).
* an explicit path: that kubeconfig file.
* empty: in-cluster (``KUBERNETES_SERVICE_HOST`` plus the ServiceAccount token), else the
  ``KUBECONFIG`` environment variable, else ``~/.kube/config``.

Credentials are loaded by ``agent.kube.kubeconfig`` and ``agent.kube.incluster`` and served by
``agent.kube.lean`` (no ``kubernetes`` import: it costs ~30 MiB resident); only kubeconfigs that
need exec plugins or auth providers go through the official ``kubernetes.config`` loader. Commands
that never talk to the API server (``discover``, ``cdi generate``) import none of it.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.common.config import Config
from agent.kube.transport import KubeHTTP, as_kubehttp

if TYPE_CHECKING:
    from agent.kube.credentials import NeedsOfficialLoaderError

log = logging.getLogger(__name__)

#: Where the kubelet mounts a pod's ServiceAccount credentials.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NO_API_SERVER = "none"


class KubeConfigError(RuntimeError):
    """No usable API server credentials; ``source`` says which one was tried."""

    def __init__(self, source: str, cause: str) -> None:
        super().__init__(f"cannot build a Kubernetes client from {source}: {cause}")
        self.source = source
        self.cause = cause


@dataclass(frozen=True, slots=True)
class ClientSource:
    """Which credentials ``api_client`` would use: ``kind`` is in-cluster, kubeconfig or none."""

    kind: str
    path: Path | None = None

    def describe(self) -> str:
        if self.kind == "kubeconfig":
            return f"kubeconfig {self.path}"
        return self.kind


def resolve_source(
    kubeconfig: str,
    env: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    home: Path | None = None,
) -> ClientSource:
    """Decide where the credentials come from, without reading them.

    ``env``/``service_account_dir``/``home`` exist for tests; the defaults are the process's.
    """
    environ = os.environ if env is None else env
    value = kubeconfig.strip()
    if value.lower() == NO_API_SERVER:
        return ClientSource("none")
    if value:
        return ClientSource("kubeconfig", Path(value).expanduser())
    token = service_account_dir / "token"
    if environ.get("KUBERNETES_SERVICE_HOST") and token.is_file():
        return ClientSource("in-cluster")
    from_env = environ.get("KUBECONFIG", "")
    # KUBECONFIG may be a list; like kubectl, the first existing entry wins here.
    for entry in (p for p in from_env.split(os.pathsep) if p):
        if Path(entry).expanduser().is_file():
            return ClientSource("kubeconfig", Path(entry).expanduser())
    base = home if home is not None else Path.home()
    return ClientSource("kubeconfig", base / ".kube" / "config")


def api_client(
    config: Config | str,
    env: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    home: Path | None = None,
    *,
    connect: bool = True,
) -> KubeHTTP | None:
    """A ``KubeHTTP`` for ``config`` (a Config or a --kubeconfig value).

    ``connect=False``: the lean client's connection pool is built by ``KubeHTTP.connect()``
    or its first request (``connect_or_raise`` turns its error into this one).

    Returns ``None`` for ``none``. Raises ``KubeConfigError`` naming the source when the
    credentials cannot be loaded, so the operator knows which file or mount to fix. The lean
    loader (no ``kubernetes`` import) is used whenever it can; a kubeconfig that needs exec
    plugins or auth providers is loaded by the official ``kubernetes.config`` instead.
    """
    from agent.kube.credentials import CredentialsError, NeedsOfficialLoaderError
    from agent.kube.incluster import load_in_cluster
    from agent.kube.kubeconfig import load_kubeconfig
    from agent.kube.lean import lean_client

    value = config.kubeconfig if isinstance(config, Config) else config
    environ = os.environ if env is None else env
    source = resolve_source(value, environ, service_account_dir, home)
    if source.kind == "none":
        return None
    try:
        if source.kind == "in-cluster":
            return lean_client(load_in_cluster(environ, service_account_dir), connect=connect)
        assert source.path is not None
        if not source.path.is_file():
            raise KubeConfigError(source.describe(), "file not found")
        try:
            return lean_client(load_kubeconfig(source.path, env=environ), connect=connect)
        except NeedsOfficialLoaderError as err:
            log.info("kubeconfig needs the official loader", extra={"why": err.cause})
            return _official_client(source, err)
    except KubeConfigError:
        raise
    except (CredentialsError, OSError, ValueError) as err:
        cause = err.cause if isinstance(err, CredentialsError) else str(err)
        raise KubeConfigError(source.describe(), cause) from err


def connect_or_raise(client: KubeHTTP, source: ClientSource) -> None:
    """``client.connect()``; TLS material that cannot be loaded is the ``KubeConfigError``
    that ``api_client`` raises for it."""
    from agent.kube.credentials import CredentialsError

    try:
        client.connect()
    except CredentialsError as err:
        raise KubeConfigError(source.describe(), err.cause) from err


def _official_client(source: ClientSource, why: NeedsOfficialLoaderError | None = None
                     ) -> KubeHTTP:
    """The kubeconfig at ``source`` loaded by ``kubernetes.config`` (exec, auth-provider).

    The proxy is the one the lean parse decided (``why.proxy_resolved``), as client-go
    decides it: the official loader alone drops proxy-url's userinfo and reads
    HTTPS_PROXY/NO_PROXY from this process by Python's rules, not from the given environment
    by Go's.
    """
    # Typed as Any: the client's own annotations are partial and not worth mirroring.
    k8s_client: Any = importlib.import_module("kubernetes.client")
    k8s_config: Any = importlib.import_module("kubernetes.config")

    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(
            config_file=str(source.path), client_configuration=configuration,
            persist_config=False,
        )  # fmt: skip
    except (k8s_config.ConfigException, OSError, ValueError) as err:
        raise KubeConfigError(source.describe(), str(err)) from err
    if why is not None and why.proxy_resolved:
        # The setter also stops the client re-reading the environment when host changes.
        configuration.proxy = why.proxy_url
        # NO_PROXY has been applied already (no proxy_url when it matched this server).
        configuration.no_proxy = ""
        configuration.proxy_headers = (
            {"proxy-authorization": why.proxy_auth} if why.proxy_auth else None)
    return as_kubehttp(k8s_client.ApiClient(configuration))
