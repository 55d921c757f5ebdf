"""Kubeconfig and in-cluster loading of the lean backend: what ends up in the urllib3 pool."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest

from agent.kube.client import KubeConfigError, api_client
from agent.kube.credentials import CredentialsError, NeedsOfficialLoaderError
from agent.kube.incluster import load_in_cluster
from agent.kube.kubeconfig import load_kubeconfig
from agent.kube.lean import LeanBackend
from tests.kube.conftest import Pki, kubeconfig

SERVER = {"server": "https://10.0.0.1:6443"}
EXEC = {"command": "x", "apiVersion": "client.authentication.k8s.io/v1", "interactiveMode": "Never"}


def test_token_user(tmp_path: Path) -> None:
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", SERVER, {"token": "t0k"}))
    assert creds.server == "https://10.0.0.1:6443" and creds.token == "t0k"
    backend = LeanBackend(creds)
    assert backend.auth_headers() == {"Authorization": "Bearer t0k"}
    assert backend.pool_kwargs()["cert_reqs"] == ssl.CERT_REQUIRED


def test_token_file_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", SERVER, {"tokenFile": "tok"}))
    assert creds.token_file == str(tmp_path / "tok")
    assert LeanBackend(creds).auth_headers() == {"Authorization": "Bearer from-file"}


def test_kubelet_style_client_cert_files(tmp_path: Path, pki: Pki) -> None:
    # The kubelet's kubeconfig names one PEM holding both certificate and key.
    pem = tmp_path / "kubelet-client-current.pem"
    cert, key = pki.client("node-a")
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority": str(pki.ca)}
    user = {"client-certificate": str(pem), "client-key": str(pem)}
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", cluster, user))
    assert (creds.cert_file, creds.key_file, creds.ca_file) == (str(pem), str(pem), str(pki.ca))
    kwargs = LeanBackend(creds).pool_kwargs()
    assert kwargs["cert_reqs"] == ssl.CERT_REQUIRED and kwargs["ca_certs"] == str(pki.ca)
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert LeanBackend(creds).auth_headers() == {}


def test_data_fields_are_decoded(tmp_path: Path, pki: Pki) -> None:
    cert, key = pki.client("node-a")
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority-data": b64(pki.ca)}
    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", cluster, user))
    assert creds.ca_data == pki.ca.read_bytes() and creds.key_data == key.read_bytes()
    kwargs = LeanBackend(creds).pool_kwargs()
    assert kwargs["ca_cert_data"] == pki.ca.read_text()
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_insecure_server_name_and_proxy(tmp_path: Path) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True,
               "tls-server-name": "kube.test", "proxy-url": "http://proxy:3128"}
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", cluster, {}))
    backend = LeanBackend(creds)
    kwargs = backend.pool_kwargs()
    assert kwargs["cert_reqs"] == ssl.CERT_NONE and kwargs["server_hostname"] == "kube.test"
    assert type(backend.pool).__name__ == "ProxyManager"
    assert backend.pool.proxy.host == "proxy"


def test_basic_auth(tmp_path: Path) -> None:
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", SERVER, {"username": "a",
                                                                 "password": "b"}))
    assert LeanBackend(creds).auth_headers() == {"Authorization": "Basic YTpi"}


@pytest.mark.parametrize(
    ("cluster", "user", "why"),
    [
        ({"server": "ftp://10.0.0.1:6443"}, {}, "is not an http(s) URL"),
        ({"server": "https://[::1"}, {}, "server is not a valid URL"),
        ({"server": "https://h:99999"}, {}, "server is not a valid URL"),
        (SERVER, {"client-key-data": "not base64!"}, "client-key-data is not base64"),
        ({**SERVER, "proxy-url": "socks5://p:1080"}, {}, "is a SOCKS proxy"),
        (SERVER, {"exec": EXEC}, "uses exec"),
        (SERVER, {"auth-provider": {"name": "oidc"}}, "uses auth-provider"),
        # Found by the fuzzer: JSON's "\ud800" and a NUL reach open() as ValueError.
        ({**SERVER, "certificate-authority": "\ud800"}, {}, "is not a usable file path"),
        (SERVER, {"tokenFile": "tok\x00en"}, "is not a usable file path"),
        (SERVER, {"client-certificate": "c\udfff", "client-key": "k"},
         "is not a usable file path"),
    ],
)
def test_bad_or_unsupported_kubeconfigs_say_why(
    tmp_path: Path, cluster: dict[str, object], user: dict[str, object], why: str
) -> None:
    with pytest.raises(CredentialsError, match=why.replace("(", r"\(").replace(")", r"\)")):
        load_kubeconfig(kubeconfig(tmp_path / "kc", cluster, user))


def test_exec_and_auth_provider_ask_for_the_official_loader(tmp_path: Path) -> None:
    with pytest.raises(NeedsOfficialLoaderError):
        load_kubeconfig(kubeconfig(tmp_path / "kc", SERVER, {"exec": EXEC}))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no current-context"),
        ("- a list\n", "no mapping"),
        ("current-context: x\ncontexts: []\n",
         "context 'x' \\(current-context\\) is not in contexts"),
        ("current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n",
         "context 'c' names no user"),
        ("{unclosed", "not valid YAML at line 1"),
        ("{" * 5000, "nested too deep"),  # PyYAML recursed into a RecursionError
    ],
)
def test_broken_kubeconfigs_name_the_file_and_the_fault(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "kc"
    path.write_text(text)
    with pytest.raises(KubeConfigError, match=why) as info:
        api_client(str(path))
    assert info.value.source == f"kubeconfig {path}"


def test_in_cluster(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token\n")
    (sa / "ca.crt").write_text("pem")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = load_in_cluster(env, sa)
    assert creds.server == "https://[fd00::1]:443"
    backend = LeanBackend(creds)
    assert backend.pool_kwargs()["ca_certs"] == str(sa / "ca.crt")
    assert backend.auth_headers() == {"Authorization": "Bearer pod-token"}


@pytest.mark.parametrize("missing", ["token", "ca.crt", "env"])
def test_in_cluster_without_its_parts_says_which(tmp_path: Path, missing: str) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    for name in ("token", "ca.crt"):
        if name != missing:
            (sa / name).write_text("x")
    env = {} if missing == "env" else {"KUBERNETES_SERVICE_HOST": "h",
                                       "KUBERNETES_SERVICE_PORT": "1"}
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE" if missing == "env"
                       else f"{missing} is missing"):
        load_in_cluster(env, sa)


def test_repr_of_credentials_leaks_no_secret() -> None:
    from agent.kube.credentials import Credentials

    creds = Credentials(server="https://k", token="tok-SECRET", password="pw-SECRET",
                        key_data=b"key-SECRET", username="admin")
    text = repr(creds)
    assert "SECRET" not in text
    assert "https://k" in text and "admin" in text


def test_proxy_credentials_stay_out_of_repr_and_go_to_the_proxy(tmp_path: Path) -> None:
    cluster = {**SERVER, "proxy-url": "http://us%40er:pw-SECRET@proxy:3128"}
    creds = load_kubeconfig(kubeconfig(tmp_path / "kc", cluster, {"token": "t"}))
    assert "SECRET" not in repr(creds) and creds.proxy_url == "http://proxy:3128"
    backend = LeanBackend(creds)
    expected = "Basic " + base64.b64encode(b"us@er:pw-SECRET").decode()
    assert backend.pool.proxy_headers == {"Proxy-Authorization": expected}
    assert "Proxy-Authorization" not in backend.auth_headers()


def test_in_cluster_uses_the_environment_proxy_unless_no_proxy_says(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    (sa / "ca.crt").write_text("pem")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "HTTPS_PROXY": "proxy.corp:3128"}
    assert load_in_cluster(env, sa).proxy_url == "http://proxy.corp:3128"
    assert load_in_cluster({**env, "NO_PROXY": "10.96.0.0/12"}, sa).proxy_url is None
    assert load_in_cluster({**env, "NO_PROXY": "10.96.0.1:443"}, sa).proxy_url is None
    assert load_in_cluster({**env, "NO_PROXY": "10.96.0.1:6443"}, sa).proxy_url is not None
