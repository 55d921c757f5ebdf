"""A real etcd + kube-apiserver (hack/realk8s/up.sh) and what tests do with it as an admin.

The scripts are the interface: tests start and stop clusters exactly as a developer does, so a
green suite also means the scripts work. Requests go through the agent's own transport
(``agent.kube.transport``), which answers every status with a ``Response`` the tests can assert on.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.kube.client import api_client
from agent.kube.transport import KubeHTTP, Response

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "realk8s"
#: Minors the bench builds; the first is the primary target.
MINORS = ("1.37", "1.35")
SA_NAMESPACE = "dra-agent"
SA_NAME = "dra-agent"
RESOURCE = "/apis/resource.k8s.io"


def minor_under_test() -> str:
    minor = os.environ.get("REALK8S_VERSION", MINORS[0])
    if minor not in MINORS:
        raise ValueError(f"REALK8S_VERSION={minor!r}: supported are {', '.join(MINORS)}")
    return minor


def bin_dir(minor: str) -> Path:
    return HACK / "bin" / minor


def script(name: str, *args: str, timeout: float = 180,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one of hack/realk8s/*.sh; never raises on a non-zero exit (tests assert on it)."""
    return subprocess.run([str(HACK / name), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=None if env is None else dict(env))


def read_env(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


@dataclass
class RealCluster:
    """One running cluster in ``dir``; ``admin`` is a system:masters client."""

    dir: Path
    minor: str
    admin: KubeHTTP = field(init=False)
    env: dict[str, str] = field(init=False)
    #: The newest resource.k8s.io version this server serves (what the helpers read at).
    resource_version: str = field(init=False)

    def __post_init__(self) -> None:
        self.env = read_env(self.dir / "cluster.env")
        served = self.env.get("RESOURCE_VERSIONS", "v1").split(",")
        self.resource_version = next(v for v in ("v1", "v1beta2", "v1beta1") if v in served)
        client = api_client(str(self.admin_kubeconfig))
        assert client is not None
        self.admin = client

    @classmethod
    def up(cls, dir: Path, minor: str, *args: str) -> RealCluster:
        # One start at a time on the machine: up.sh takes free ports by binding port 0 and
        # closing it, seconds before etcd and kube-apiserver bind them, and a second start
        # meanwhile (another pytest-xdist worker's) could be handed the same ones.
        lock_path = HACK / "bin" / ".up.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out = script("up.sh", "--version", minor, *args, str(dir))
        if out.returncode != 0:
            raise RuntimeError(f"up.sh failed ({out.returncode}): {out.stderr.strip()}")
        return cls(dir, minor)

    def down(self) -> None:
        self.admin.close()
        out = script("down.sh", str(self.dir))
        assert out.returncode == 0, out.stderr

    # --- identities ---------------------------------------------------------------------

    @property
    def server(self) -> str:
        return self.env["SERVER"]

    @property
    def git_version(self) -> str:
        return self.env["GIT_VERSION"]

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    def node_kubeconfig(self, node: str) -> Path:
        """The kubelet's identity for ``node`` (system:node:<node> in system:nodes)."""
        out = script("node-kubeconfig.sh", str(self.dir), node)
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip())

    def client(self, kubeconfig: Path) -> KubeHTTP:
        client = api_client(str(kubeconfig))
        assert client is not None
        return client

    def token_kubeconfig(self, token: str, name: str) -> Path:
        ca = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        doc = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "realk8s", "cluster": {
                "server": self.server, "certificate-authority-data": ca}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "realk8s", "user": name}}],
            "current-context": name,
        }
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def agent_pod(self, node: str) -> dict[str, Any]:
        """A Pod of the agent's ServiceAccount bound to ``node``, as the DaemonSet would make it
        (no controller runs here, so the test makes it)."""
        name = f"dra-agent-{node}"
        found = self.admin.request("GET", f"/api/v1/namespaces/{SA_NAMESPACE}/pods/{name}")
        if found.status == 200:
            pod: dict[str, Any] = found.json()
            return pod
        return self.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": SA_NAMESPACE},
            "spec": {"serviceAccountName": SA_NAME, "nodeName": node,
                     "containers": [{"name": "agent", "image": "dra-agent"}]},
        })

    def agent_token(self, node: str, pod: Mapping[str, Any] | None = None) -> str:
        """A TokenRequest token of the agent's ServiceAccount bound to a Pod on ``node``: the
        server puts the node's name into the token's user info, which the VAP reads."""
        pod = pod or self.agent_pod(node)
        meta = pod["metadata"]
        review = self.admin.request(
            "POST", f"/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts/{SA_NAME}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "uid": meta["uid"]}}})
        review.raise_for_status()
        token: str = review.json()["status"]["token"]
        return token

    def agent_kubeconfig(self, node: str) -> Path:
        """The DaemonSet's credentials on ``node``."""
        return self.token_kubeconfig(self.agent_token(node), f"sa-{node}")

    # --- objects --------------------------------------------------------------------------

    def create(self, obj: Mapping[str, Any], client: KubeHTTP | None = None,
               query: Mapping[str, str] | None = None) -> dict[str, Any]:
        resp = self.create_response(obj, client, query)
        resp.raise_for_status()
        created: dict[str, Any] = resp.json()
        return created

    def create_response(self, obj: Mapping[str, Any], client: KubeHTTP | None = None,
                        query: Mapping[str, str] | None = None) -> Response:
        return (client or self.admin).request("POST", collection_path(obj), body=dict(obj),
                                              query=query)

    def get(self, path: str) -> dict[str, Any] | None:
        resp = self.admin.request("GET", path)
        if resp.status == 404:
            return None
        resp.raise_for_status()
        doc: dict[str, Any] = resp.json()
        return doc

    def ensure_node(self, name: str) -> dict[str, Any]:
        node = self.get(f"/api/v1/nodes/{name}")
        if node is not None:
            return node
        return self.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"kubernetes.io/hostname": name}}})

    def slices(self, node: str | None = None, version: str | None = None
               ) -> list[dict[str, Any]]:
        version = version or self.resource_version
        query = {"fieldSelector": f"spec.nodeName={node}"} if node else None
        resp = self.admin.request("GET", f"{RESOURCE}/{version}/resourceslices", query=query)
        resp.raise_for_status()
        items: list[dict[str, Any]] = resp.json()["items"]
        return items

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig)}
        return subprocess.run([str(bin_dir(self.minor) / "kubectl"), *args], capture_output=True,
                              text=True, timeout=timeout, check=False, env=env, input=input,
                              cwd=REPO)

    def apply_deploy(self, target: str = "base") -> None:
        """``kubectl apply --server-side -k deploy/<target>``, as an operator installs it."""
        out = self.kubectl("apply", "--server-side", "--force-conflicts", "-k",
                           str(REPO / "deploy" / target))
        assert out.returncode == 0, out.stdout + out.stderr


#: Plural and scope of each kind the tests create.
_KINDS = {
    "Node": ("nodes", False), "Namespace": ("namespaces", False), "Pod": ("pods", True),
    "ResourceSlice": ("resourceslices", False), "ResourceClaim": ("resourceclaims", True),
    "ResourceClaimTemplate": ("resourceclaimtemplates", True),
    "DeviceClass": ("deviceclasses", False), "ServiceAccount": ("serviceaccounts", True),
}


def collection_path(obj: Mapping[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    plural, namespaced = _KINDS[str(obj["kind"])]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced:
        return f"{base}/namespaces/{obj['metadata'].get('namespace', 'default')}/{plural}"
    return f"{base}/{plural}"


def status_text(resp: Response) -> str:
    """code, reason and message of an error answer, for assertions and failure output."""
    try:
        doc = resp.json()
    except ValueError:
        return f"{resp.status} {resp.data[:200]!r}"
    return f"{resp.status} {doc.get('reason', '')}: {doc.get('message', '')}"


@contextlib.contextmanager
def running(prefix: str, *up_args: str) -> Iterator[RealCluster]:
    """A cluster of the minor under test in a fresh temp dir, stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = RealCluster.up(root / "c", minor_under_test(), *up_args)
    try:
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
