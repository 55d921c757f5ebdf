"""Kubeconfigs the lean loader does not handle go through the official loader."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from agent.kube.client import KubeConfigError, api_client
from tests.kube.conftest import EchoServer, Pki, kubeconfig

CREDENTIAL = {
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {"token": "exec-token"},
}


def _plugin(tmp_path: Path, output: str) -> Path:
    script = tmp_path / "credential-plugin"
    script.write_text(f"#!{sys.executable}\nprint({output!r})\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_an_exec_plugin_kubeconfig_uses_the_official_loader(
    tmp_path: Path, pki: Pki, tls_echo: EchoServer
) -> None:
    plugin = _plugin(tmp_path, json.dumps(CREDENTIAL))
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": str(plugin), "interactiveMode": "Never"}}
    cluster = {"server": tls_echo.url(), "certificate-authority": str(pki.ca)}
    http = api_client(str(kubeconfig(tmp_path / "kc", cluster, user)))
    assert http is not None and type(http.backend).__name__ == "OfficialBackend"
    assert http.request("GET", "/api", query={"a": "1"}).ok
    assert tls_echo.seen[-1].path == "/api?a=1"
    assert tls_echo.last_auth() == "Bearer exec-token"


def test_an_exec_plugin_is_not_run_for_a_plain_http_server(
    tmp_path: Path, echo: EchoServer
) -> None:
    # client-go merges no user credentials for http: the plugin's token never goes out clear.
    plugin = _plugin(tmp_path, json.dumps(CREDENTIAL))
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": str(plugin), "interactiveMode": "Never"}}
    http = api_client(str(kubeconfig(tmp_path / "kc", {"server": echo.url()}, user)))
    assert http is not None and http.request("GET", "/api").ok
    assert echo.last_auth() is None


def test_an_official_loader_failure_names_the_kubeconfig(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path, json.dumps(CREDENTIAL))
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": str(plugin), "interactiveMode": "Never"}}
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority": "/nonexistent/ca"}
    path = kubeconfig(tmp_path / "kc", cluster, user)
    with pytest.raises(KubeConfigError, match="/nonexistent/ca") as info:
        api_client(str(path))
    assert info.value.source == f"kubeconfig {path}"
