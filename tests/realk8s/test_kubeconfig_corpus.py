"""Every kubeconfig of the corpus (tests/data/kubeconfigs/corpus.yaml) through the real kubectl
and through the agent's loader, against the real kube-apiserver: kubectl still answers what
was recorded (so the recording cannot rot), and the agent answers alike (TLS to a wrong CA
fails in both; the proxy sees the same tunnels and Proxy-Authorization).

On a mismatch the failure shows kubectl's answer in the corpus's form; paste it into the case
after checking that kubectl's behaviour really changed.
"""

from __future__ import annotations

import base64
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.kube.transport import Response
from tests.kube.corpus import (
    WHOAMI,
    WHOAMI_BODY,
    Bench,
    Case,
    RecordingProxy,
    agent_outcome,
    dumps,
    iter_secrets_in,
    load_corpus,
    materialize,
    pem_values,
    whoami_user,
)
from tests.realk8s.cluster import RealCluster, bin_dir

CASES = load_corpus()
NAMESPACE = "default"


def _token(cluster: RealCluster, account: str) -> str:
    cluster.admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", body={
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})
    resp = cluster.admin.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 3600}})
    resp.raise_for_status()
    token: str = resp.json()["status"]["token"]
    return token


def _other_ca(root: Path) -> bytes:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "other.key", "-out",
                    "other.crt", "-days", "2", "-subj", "/CN=not-the-cluster-ca"],
                   cwd=root, check=True, capture_output=True)
    return (root / "other.crt").read_bytes()


@pytest.fixture(scope="module")
def bench(cluster: RealCluster) -> Iterator[Bench]:
    import yaml

    root = Path(tempfile.mkdtemp(prefix="corpus-", dir=cluster.dir))
    admin_user = yaml.safe_load(cluster.admin_kubeconfig.read_text())["users"][0]["user"]
    cert = base64.b64decode(admin_user["client-certificate-data"])
    key = base64.b64decode(admin_user["client-key-data"])
    admin_name = whoami_user(cluster.admin.request("POST", WHOAMI, body=WHOAMI_BODY), {})
    ca = cluster.dir / "pki" / "ca.crt"
    other_ca = _other_ca(root)
    (root / "other-ca.crt").write_bytes(other_ca)
    port = cluster.env["API_PORT"]
    proxy = RecordingProxy(("127.0.0.1", int(port)))
    token_a, token_b = _token(cluster, "corpus-a"), _token(cluster, "corpus-b")
    users = {f"system:serviceaccount:{NAMESPACE}:corpus-a": "token-a",
             f"system:serviceaccount:{NAMESPACE}:corpus-b": "token-b", admin_name: "cert"}
    values = {
        **pem_values(ca.read_bytes(), other_ca, cert, key),
        "SERVER": cluster.server, "SERVER_HOSTPORT": f"127.0.0.1:{port}",
        "SERVER_NAMED": f"https://apiserver.corpus.test:{port}",
        "SERVER_NAME": "kubernetes.default.svc", "CA_FILE": str(ca),
        "OTHER_CA_FILE": str(root / "other-ca.crt"), "TOKEN_A": token_a, "TOKEN_B": token_b,
        "PROXY": proxy.address,
    }

    def identify(resp: Response) -> str:
        return whoami_user(resp, users)

    try:
        # The real server ignores Basic credentials: they read as anonymous here.
        yield Bench(values, proxy, identify, aliases={"basic": "anonymous"}, users=users)
    finally:
        proxy.close()


def kubectl_outcome(minor: str, path: Path, env: dict[str, str], bench: Bench
                    ) -> dict[str, Any]:
    """kubectl's answer to a case, in the corpus's terms."""
    bench.proxy.seen.clear()
    out = subprocess.run(
        [str(bin_dir(minor) / "kubectl"), "--kubeconfig", str(path), "auth", "whoami", "-o",
         "jsonpath={.status.userInfo.username}"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
        stdin=subprocess.DEVNULL, cwd=path.parent,
    )  # fmt: skip
    text = (out.stdout + out.stderr).strip()
    answer: dict[str, Any]
    if out.returncode == 0:
        name = out.stdout.strip()
        answer = {"user": bench.users.get(name, name)}
    elif "selfsubjectreviews API is not enabled" in text:
        answer = {"user": "anonymous"}
    elif "x509:" in text or "tls:" in text:
        answer = {"tls": "failed"}
    elif "the server rejected our request for an unknown reason" in text:
        answer = {"plain-http": True}
    elif "Unable to connect to the server" in text or "was refused" in text:
        return {"unreachable": text}
    else:
        return {"refused": text}
    if bench.proxy.seen:
        answer["proxy"] = bench.proxy.seen[-1] or "anonymous"
    return answer


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kubectl_still_answers_as_recorded_and_the_agent_alike(
    case: Case, bench: Bench, minor: str, tmp_path: Path
) -> None:
    path, env = materialize(case, bench, tmp_path / case.name)
    seen = kubectl_outcome(minor, path, env, bench)
    assert bench.same(case.answer, seen), (
        f"kubectl {minor} now answers {dumps(seen)}; recorded {dumps(case.answer)}")
    agent = agent_outcome(path, env, bench)
    if "refused" in agent:
        assert case.agent is not None and case.agent in agent["refused"], agent
        assert list(iter_secrets_in(agent["refused"], bench)) == [], agent["refused"]
        return
    assert bench.same(case.answer, agent), (
        f"the agent answers {agent}; kubectl {minor} {dumps(case.answer)}")
