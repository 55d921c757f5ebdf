"""The lean backend against a real TLS server: CA, client certificates, server names."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from agent.kube.client import api_client
from agent.kube.errors import KubeAPIError
from agent.kube.transport import KubeHTTP
from tests.kube.conftest import EchoServer, Pki, kubeconfig


def _client(tmp_path: Path, cluster: dict[str, object], user: dict[str, object]) -> KubeHTTP:
    http = api_client(str(kubeconfig(tmp_path / "kc", cluster, user)))
    assert http is not None
    return http


def test_ca_file_and_client_cert_files(tmp_path: Path, pki: Pki, tls_echo: EchoServer) -> None:
    cert, key = pki.client("node-a")
    http = _client(tmp_path, {"server": tls_echo.url(), "certificate-authority": str(pki.ca)},
                   {"client-certificate": str(cert), "client-key": str(key)})
    assert http.request("GET", "/api").ok
    assert tls_echo.seen[-1].client_cn == "system:node:node-a"
    assert tls_echo.last_auth() is None


def test_ca_and_client_cert_data(tmp_path: Path, pki: Pki, tls_echo: EchoServer) -> None:
    cert, key = pki.client("node-b")
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    http = _client(tmp_path, {"server": tls_echo.url(), "certificate-authority-data": b64(pki.ca)},
                   {"client-certificate-data": b64(cert), "client-key-data": b64(key),
                    "token": "also-a-token"})
    assert http.request("GET", "/api").ok
    assert tls_echo.seen[-1].client_cn == "system:node:node-b"
    assert tls_echo.last_auth() == "Bearer also-a-token"


def test_an_unknown_ca_is_refused(tmp_path: Path, pki: Pki, tls_echo: EchoServer) -> None:
    http = _client(tmp_path, {"server": tls_echo.url(), "certificate-authority":
                              str(pki.other_ca)}, {"token": "t"})
    with pytest.raises(KubeAPIError) as info:
        http.request("GET", "/api")
    assert info.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in info.value.message
    assert tls_echo.seen == []


def test_insecure_skip_verify_accepts_any_certificate(
    tmp_path: Path, pki: Pki, tls_echo: EchoServer
) -> None:
    http = _client(tmp_path, {"server": tls_echo.url("localhost"),
                              "insecure-skip-tls-verify": True}, {"token": "t"})
    assert http.request("GET", "/api").ok


def test_tls_server_name_verifies_another_name(
    tmp_path: Path, pki: Pki, tls_echo: EchoServer
) -> None:
    # The certificate names kube.test and 127.0.0.1, not localhost.
    cluster = {"server": tls_echo.url("localhost"), "certificate-authority": str(pki.ca)}
    with pytest.raises(KubeAPIError, match="localhost"):
        _client(tmp_path, cluster, {}).request("GET", "/api")
    named = _client(tmp_path, {**cluster, "tls-server-name": "kube.test"}, {})
    assert named.request("GET", "/api").ok
