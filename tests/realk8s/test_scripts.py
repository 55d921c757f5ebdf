"""hack/realk8s/*.sh as a developer meets them: two clusters side by side, and every wrong
start answered in one clear line."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.realk8s.cluster import HACK, read_env, script
from tests.realk8s.conftest import StartCluster


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_two_clusters_side_by_side_and_the_identities(start_cluster: StartCluster) -> None:
    a, b = start_cluster(), start_cluster()
    assert a.server != b.server
    for real in (a, b):
        version = real.get("/version")
        assert version is not None and version["gitVersion"] == real.git_version
        assert version["gitVersion"].startswith(f"v{real.minor}.")
    # The node identity: system:node:<name> in system:nodes, as the kubelet's own.
    review = a.client(a.node_kubeconfig("node-x")).request(
        "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status == 201, review.data
    user = review.json()["status"]["userInfo"]
    assert user["username"] == "system:node:node-x"
    assert "system:nodes" in user["groups"]


def test_missing_binary_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ)
    # A minor the bench knows but whose binaries are absent: point the script at a copy.
    fake = tmp_path / "realk8s"
    fake.mkdir()
    for name in ("up.sh", "lib.sh", "down.sh"):
        (fake / name).write_bytes((HACK / name).read_bytes())
        (fake / name).chmod(0o755)
    (fake / "v1.37").mkdir()
    out = subprocess.run([str(fake / "up.sh"), "--version", "1.37", str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=60, check=False, env=env)
    assert out.returncode == 1
    assert one_line(out) == (f"up.sh: {fake}/bin/1.37/etcd is missing: run "
                             "hack/realk8s/build.sh 1.37 first")


def test_unknown_minor_is_one_line(tmp_path: Path) -> None:
    out = script("up.sh", "--version", "1.20", str(tmp_path / "c"))
    assert out.returncode == 1
    assert one_line(out) == "up.sh: unknown Kubernetes minor '1.20' (supported: 1.37, 1.35)"


def test_port_in_use_is_one_line(minor: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = script("up.sh", "--version", minor, "--port", str(port), str(tmp_path / "c"))
    assert out.returncode == 1
    assert one_line(out) == (f"up.sh: port {port} on 127.0.0.1 is in use; pick another --port "
                             "or leave it out")
    assert not (tmp_path / "c" / "cluster.env").exists()


def test_stale_and_running_dirs_are_refused_and_down_is_idempotent(
    start_cluster: StartCluster, minor: str
) -> None:
    real = start_cluster()
    again = script("up.sh", "--version", minor, str(real.dir))
    assert again.returncode == 1
    pid = read_env(real.dir / "cluster.env")["APISERVER_PID"]
    assert one_line(again) == (
        f"up.sh: a cluster is already running in {real.dir} (kube-apiserver pid {pid}); "
        f"stop it with hack/realk8s/down.sh {real.dir}")
    real.down()
    assert not Path(f"/proc/{pid}").exists() or "kube-apiserver" not in Path(
        f"/proc/{pid}/cmdline").read_text(errors="replace")
    # Down on a dead cluster succeeds; nothing was removed.
    assert script("down.sh", str(real.dir)).returncode == 0
    assert (real.dir / "etcd").is_dir() and (real.dir / "apiserver.log").is_file()
    stale = script("up.sh", "--version", minor, str(real.dir))
    assert stale.returncode == 1
    assert one_line(stale) == (f"up.sh: {real.dir} holds a stopped cluster's state (cluster.env,"
                               " etcd data); remove it or use an empty DIR")


def test_down_on_a_dir_without_a_cluster_succeeds(tmp_path: Path) -> None:
    out = script("down.sh", str(tmp_path))
    assert out.returncode == 0
    assert "nothing to stop" in out.stderr


def test_build_without_the_module_proxy_names_the_module(tmp_path: Path) -> None:
    """No network to the proxy (one that refuses connections, an empty module cache): one
    line naming the module that could not be had; the same with module lookups off."""
    copy = tmp_path / "realk8s"
    copy.mkdir()
    (copy / "build.sh").write_bytes((HACK / "build.sh").read_bytes())
    (copy / "build.sh").chmod(0o755)
    (copy / "v1.37").mkdir()
    for name in ("go.mod", "go.sum"):
        (copy / "v1.37" / name).write_bytes((HACK / "v1.37" / name).read_bytes())
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for proxy in (dead, "off"):
        env = {**os.environ, "GOPROXY": proxy, "GOMODCACHE": str(tmp_path / "mod"),
               "GOFLAGS": "-modcacherw"}
        out = subprocess.run([str(copy / "build.sh"), "1.37"], capture_output=True, text=True,
                             timeout=300, check=False, env=env)
        assert out.returncode == 1, out.stderr
        line = [x for x in out.stderr.splitlines() if x.strip()][-1]
        assert line.startswith("build.sh: cannot download module "), out.stderr
        module = line.split("cannot download module ", 1)[1].split(" ", 1)[0]
        assert "@v" in module, line
        assert f"({proxy})" in line
        assert not (copy / "bin" / "1.37" / "kube-apiserver").exists()


def test_build_is_a_noop_when_current(minor: str) -> None:
    first = script("build.sh", minor, timeout=1800)  # current already, unless build.sh changed
    assert first.returncode == 0, first.stderr
    out = script("build.sh", minor, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "is current, nothing to do" in out.stderr
    assert out.stdout.strip() == str(HACK / "bin" / minor)
