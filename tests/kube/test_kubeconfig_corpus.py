"""The agent's loader against every corpus case, on a recording TLS server: it accepts,
refuses and connects as kubectl's recorded answer says (tests/realk8s/test_kubeconfig_corpus.py
checks the recording against the real kubectl)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kube.transport import Response
from tests.kube.conftest import EchoServer, Pki, _serve
from tests.kube.corpus import (
    Bench,
    Case,
    RecordingProxy,
    agent_outcome,
    dumps,
    iter_secrets_in,
    load_corpus,
    materialize,
    pem_values,
)

CASES = load_corpus()
TOKEN_A, TOKEN_B = "token-a-9f2c41d7e0b8", "token-b-3e8a5c6f1d2b"


@pytest.fixture(scope="module")
def servers(pki: Pki) -> Iterator[tuple[EchoServer, EchoServer]]:
    """One https and one plain-http recording server for all cases (each stop costs ~0.5 s)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    with contextlib.ExitStack() as stack:
        tls_echo = stack.enter_context(contextlib.contextmanager(_serve)(ctx))
        echo = stack.enter_context(contextlib.contextmanager(_serve)(None))
        yield tls_echo, echo


@pytest.fixture
def bench(pki: Pki, servers: tuple[EchoServer, EchoServer]) -> Iterator[Bench]:
    tls_echo, echo = servers
    tls_echo.seen.clear()
    echo.seen.clear()
    proxy = RecordingProxy(("127.0.0.1", tls_echo.port))
    cert, key = pki.client("node-a")

    def identify(resp: Response) -> str:
        if echo.seen:  # the plain-http server: fine only without credentials
            return "plain-http" if "authorization" not in echo.seen[-1].headers else \
                "plain-http with credentials"
        seen = tls_echo.seen[-1]
        auth = seen.headers.get("authorization", "")
        if seen.client_cn:
            # The real server's authenticator takes the certificate before a token.
            return "cert"
        return {f"Bearer {TOKEN_A}": "token-a", f"Bearer {TOKEN_B}": "token-b"}.get(
            auth, "basic" if auth.startswith("Basic ") else auth or "anonymous")

    values = {
        **pem_values(pki.ca.read_bytes(), pki.other_ca.read_bytes(), cert.read_bytes(),
                     key.read_bytes()),
        "SERVER": tls_echo.url(), "SERVER_HOSTPORT": f"127.0.0.1:{echo.port}",
        "SERVER_NAMED": f"https://apiserver.corpus.test:{tls_echo.port}",
        "SERVER_NAME": "kube.test", "CA_FILE": str(pki.ca), "OTHER_CA_FILE": str(pki.other_ca),
        "TOKEN_A": TOKEN_A, "TOKEN_B": TOKEN_B, "PROXY": proxy.address,
    }
    try:
        yield Bench(values, proxy, identify)
    finally:
        proxy.close()


def test_the_corpus_covers_what_the_issue_lists() -> None:
    names = {case.name for case in CASES}
    assert len(names) == len(CASES) >= 25
    for wanted in ("insecure-as-string-false", "insecure-with-ca-data", "ca-data-and-ca-file",
                   "token-and-token-file", "token-and-empty-token-file", "empty-token-file",
                   "missing-token-file", "proxy-url-with-userinfo", "https-proxy-env",
                   "no-proxy-domain", "exec-plugin", "client-cert-data", "client-cert-files",
                   "client-key-without-cert", "unknown-fields-are-ignored",
                   "current-context-not-set", "server-without-scheme",
                   "exec-plugin-with-proxy-userinfo", "exec-plugin-https-proxy-env"):
        assert wanted in names


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_agent_answers_as_kubectl_did(case: Case, bench: Bench, tmp_path: Path) -> None:
    path, env = materialize(case, bench, tmp_path / case.name)
    seen = agent_outcome(path, env, bench)
    if "refused" in seen:
        message = seen["refused"]
        assert "\n" not in message and str(path) in message
        assert list(iter_secrets_in(message, bench)) == [], message
        assert case.agent is not None, f"the agent refused where kubectl did not: {message}"
        assert case.agent in message
        assert "refused" in case.answer or "unreachable" in case.answer, message
        return
    assert case.agent is None, f"kubectl refused ({dumps(case.answer)}); the agent {seen}"
    assert bench.same(case.answer, seen), f"recorded {dumps(case.answer)}, the agent {seen}"
