"""agent/kube/client.py: where the API credentials come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.common.config import Config
from agent.kube.client import KubeConfigError, api_client, resolve_source

KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: c
clusters: [{name: k, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: secret-token}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
"""


@pytest.fixture
def sa_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    (d / "token").write_text("pod-token")
    (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    return d


def test_none_means_no_api_server() -> None:
    assert api_client("none") is None
    assert api_client(Config(kubeconfig="None")) is None


def test_explicit_path_wins(tmp_path: Path, sa_dir: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(KUBECONFIG)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert resolve_source(str(path), env, sa_dir).path == path
    client = api_client(str(path), env, sa_dir)
    assert client is not None and client.server == "https://10.0.0.1:6443"
    assert client.backend.auth_headers() == {"Authorization": "Bearer secret-token"}


def test_in_cluster_when_the_service_host_and_token_exist(sa_dir: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert resolve_source("", env, sa_dir).kind == "in-cluster"
    client = api_client("", env, sa_dir)
    assert client is not None and client.server == "https://10.96.0.1:443"
    assert client.backend.auth_headers() == {"Authorization": "Bearer pod-token"}


def test_kubeconfig_env_then_home(tmp_path: Path) -> None:
    first = tmp_path / "missing"
    second = tmp_path / "kc"
    second.write_text(KUBECONFIG)
    env = {"KUBECONFIG": f"{first}:{second}"}
    assert resolve_source("", env, tmp_path / "nosa").path == second
    assert resolve_source("", {}, tmp_path / "nosa", home=tmp_path).path == (
        tmp_path / ".kube" / "config"
    )


def test_missing_file_names_the_source(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*/nope: file not found"):
        api_client(str(tmp_path / "nope"))


def test_broken_file_names_the_source(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(KubeConfigError) as info:
        api_client(str(path))
    assert info.value.source == f"kubeconfig {path}"
