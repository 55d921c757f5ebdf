"""Build a ``kubernetes`` ApiClient from the agent's Config.

Resolution order for ``--kubeconfig`` (DESIGN.md, "Command line"):

* ``none``: no API server; callers get ``None`` and run without one (kubelet standalone).
* an explicit path: that kubeconfig file.
* empty: in-cluster (``KUBERNETES_SERVICE_HOST`` plus the ServiceAccount token), else the
  ``KUBECONFIG`` environment variable, else ``~/.kube/config``.

The kubernetes package is imported inside the function: commands that never talk to the API
server (``discover``, ``cdi generate``) must not pay its import cost.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import Config

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
) -> Any | None:
    """A ``kubernetes.client.ApiClient`` for ``config`` (a Config or a --kubeconfig value).

    Returns ``None`` for ``none``. Raises ``KubeConfigError`` naming the source when the
    credentials cannot be loaded, so the operator knows which file or mount to fix.
    """
    value = config.kubeconfig if isinstance(config, Config) else config
    source = resolve_source(value, env, service_account_dir, home)
    if source.kind == "none":
        return None

    # Typed as Any: the client's own annotations are partial and not worth mirroring.
    k8s_client: Any = importlib.import_module("kubernetes.client")
    k8s_config: Any = importlib.import_module("kubernetes.config")

    configuration = k8s_client.Configuration()
    try:
        if source.kind == "in-cluster":
            loader = k8s_config.incluster_config.InClusterConfigLoader(
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
                environ=dict(os.environ if env is None else env),
            )
            loader.load_and_set(configuration)
        else:
            assert source.path is not None
            if not source.path.is_file():
                raise KubeConfigError(source.describe(), "file not found")
            k8s_config.load_kube_config(
                config_file=str(source.path),
                client_configuration=configuration,
                persist_config=False,
            )
    except KubeConfigError:
        raise
    except (k8s_config.ConfigException, OSError, ValueError) as err:
        raise KubeConfigError(source.describe(), str(err)) from err
    return k8s_client.ApiClient(configuration)
