"""Rotating credentials: token files and client certificates are read again."""

from __future__ import annotations

import os
from pathlib import Path

from agent.kube.credentials import Credentials
from agent.kube.incluster import load_in_cluster
from agent.kube.lean import RECHECK_S, LeanBackend
from agent.kube.transport import KubeHTTP
from tests.kube.conftest import Answer, EchoServer, FakeClock, Pki


def test_token_file_is_read_again_after_a_minute(tmp_path: Path, echo: EchoServer) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    clock = FakeClock()
    http = KubeHTTP(LeanBackend(Credentials(echo.url(), token_file=str(token)), clock))
    http.request("GET", "/a")
    token.write_text("two")
    http.request("GET", "/a")
    assert echo.last_auth() == "Bearer one"  # cached: not read on every request
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert echo.last_auth() == "Bearer two"


def test_a_401_makes_the_next_request_read_the_token_again(
    tmp_path: Path, echo: EchoServer
) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    http = KubeHTTP(LeanBackend(Credentials(echo.url(), token_file=str(token)), FakeClock()))
    echo.answers.append(Answer(401, b'{"kind":"Status","reason":"Unauthorized","code":401}'))
    assert http.request("GET", "/a").error().status == 401
    token.write_text("new")
    http.request("GET", "/a")
    assert [s.headers["authorization"] for s in echo.seen] == ["Bearer old", "Bearer new"]


def test_a_token_file_missing_mid_rotation_keeps_the_last_token(
    tmp_path: Path, echo: EchoServer
) -> None:
    token = tmp_path / "token"
    token.write_text("kept")
    clock = FakeClock()
    http = KubeHTTP(LeanBackend(Credentials(echo.url(), token_file=str(token)), clock))
    http.request("GET", "/a")
    token.unlink()
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert echo.last_auth() == "Bearer kept"


def test_in_cluster_token_rotation(tmp_path: Path, echo: EchoServer) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("first")
    (sa / "ca.crt").write_text("pem")
    creds = load_in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                             "KUBERNETES_SERVICE_PORT": str(echo.port)}, sa)
    clock = FakeClock()
    # The fake server speaks plain http; everything else is the in-cluster credentials.
    http = KubeHTTP(LeanBackend(Credentials(echo.url(), token_file=creds.token_file), clock))
    http.request("GET", "/a")
    # The kubelet swaps projected tokens by replacing the symlinked directory's file.
    (sa / "token.new").write_text("second")
    os.replace(sa / "token.new", sa / "token")
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert [s.headers["authorization"] for s in echo.seen] == ["Bearer first", "Bearer second"]


def test_a_renewed_client_certificate_is_presented(
    tmp_path: Path, pki: Pki, tls_echo: EchoServer
) -> None:
    pem = tmp_path / "kubelet-client-current.pem"
    cert_a, key_a = pki.client("node-a")
    cert_b, key_b = pki.client("node-b")
    pem.write_bytes(cert_a.read_bytes() + key_a.read_bytes())
    clock = FakeClock()
    creds = Credentials(tls_echo.url(), ca_file=str(pki.ca), cert_file=str(pem),
                        key_file=str(pem))
    backend = LeanBackend(creds, clock)
    http = KubeHTTP(backend)
    http.request("GET", "/a")
    first_pool = backend.pool
    pem.write_bytes(cert_b.read_bytes() + key_b.read_bytes())
    os.utime(pem, (os.stat(pem).st_atime, os.stat(pem).st_mtime + 10))
    http.request("GET", "/a")
    assert backend.pool is first_pool  # not looked at before a minute has passed
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert backend.pool is not first_pool
    assert [s.client_cn for s in tls_echo.seen] == ["system:node:node-a"] * 2 + [
        "system:node:node-b"]


def test_a_half_written_certificate_keeps_the_old_one_in_use(
    tmp_path: Path, pki: Pki, tls_echo: EchoServer
) -> None:
    pem = tmp_path / "client.pem"
    cert_a, key_a = pki.client("node-a")
    _, key_b = pki.client("node-b")
    pem.write_bytes(cert_a.read_bytes() + key_a.read_bytes())
    clock = FakeClock()
    backend = LeanBackend(Credentials(tls_echo.url(), ca_file=str(pki.ca), cert_file=str(pem),
                                      key_file=str(pem)), clock)
    pem.write_bytes(cert_a.read_bytes() + key_b.read_bytes())  # key of another certificate
    os.utime(pem, (os.stat(pem).st_atime, os.stat(pem).st_mtime + 10))
    clock.now += RECHECK_S
    assert KubeHTTP(backend).request("GET", "/a").ok
    assert tls_echo.seen[-1].client_cn == "system:node:node-a"


def test_a_token_file_empty_mid_rotation_keeps_the_last_token(
    tmp_path: Path, echo: EchoServer
) -> None:
    # client-go's cached file token source treats an empty read as a failed one.
    token = tmp_path / "token"
    token.write_text("kept")
    clock = FakeClock()
    http = KubeHTTP(LeanBackend(Credentials(echo.url(), token_file=str(token)), clock))
    http.request("GET", "/a")
    token.write_text("")
    clock.now += RECHECK_S
    http.request("GET", "/a")
    token.write_text("next\n")
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert [s.headers.get("authorization") for s in echo.seen] == [
        "Bearer kept", "Bearer kept", "Bearer next"]


def test_the_token_file_wins_over_the_inline_token_once_readable(
    tmp_path: Path, echo: EchoServer
) -> None:
    token = tmp_path / "token"
    clock = FakeClock()
    creds = Credentials(echo.url(), token="inline", token_file=str(token))
    http = KubeHTTP(LeanBackend(creds, clock))
    http.request("GET", "/a")  # no file yet: the inline token stands in
    token.write_text("from-file")
    clock.now += RECHECK_S
    http.request("GET", "/a")
    assert [s.headers["authorization"] for s in echo.seen] == ["Bearer inline",
                                                               "Bearer from-file"]
