"""Device metadata against bad input: a directory that cannot be written, anything planted at
our paths, names that would leave the directory, a claim name reused while the old claim is
prepared. Each gets one clear per-claim line, loses nothing and leaves no half state.

Prepares that might block (a FIFO at our path) run in a thread joined with a timeout: the
assertion is that they end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.codec import CheckpointCorruptError, decode
from agent.claim.model import POD_CLAIM_NAME_ANNOTATION, AllocatedDevice, ClaimRef
from agent.prepare.metadata import names_problem
from tests.plugnode import DRIVER, Node, make_claim
from tests.prepare.test_device_metadata import meta_file, meta_root, uid_of


def spec_path(node: Node, uid: str) -> Path:
    return node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"


def in_thread(call: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "blocked on a planted file"
    return out[0]


def assert_nothing_left(node: Node, claim: dict[str, Any]) -> None:
    uid = uid_of(claim)
    assert not spec_path(node, uid).exists()
    if node.checkpoint.exists():  # not written at all until a first durable change
        assert uid not in decode(node.checkpoint.read_bytes()).claims


def one_line(error: str) -> str:
    assert error and "\n" not in error and "Traceback" not in error
    return error


# -- a directory that cannot be written ---------------------------------------------------------


def test_a_file_where_the_claim_dir_should_be_fails_that_claim_alone(node: Node) -> None:
    bad = node.book.put(make_claim("c1", ["gpu-0"]))
    good = node.book.put(make_claim("c2", ["gpu-1"]))
    blocker = meta_root(node) / "default_c1"
    meta_root(node).mkdir(parents=True)
    blocker.write_text("not a directory")
    out = node.prepare(bad, good)
    error = one_line(out[uid_of(bad)].error)
    assert f"cannot write device metadata {meta_file(node, 'c1')}" in error
    assert f"{blocker} is not a directory" in error
    assert_nothing_left(node, bad)
    assert blocker.read_text() == "not a directory"  # lost nothing
    assert out[uid_of(good)].ok and meta_file(node, "c2").exists()
    assert node.metrics.registry.get_sample_value(
        "dra_agent_claim_errors_total", {"operation": "prepare", "reason": "device_metadata"}
    ) == 1
    blocker.unlink()  # the operator fixes it; the kubelet's retry works
    assert node.prepare(bad)[uid_of(bad)].ok


IN_NAMESPACE = "DRA_AGENT_TEST_IN_MOUNT_NAMESPACE"


@pytest.fixture
def read_only_dir(node: Node) -> Iterator[Path | None]:
    """A read-only file system at ``dra-device-metadata`` (a real one: root ignores modes);
    None where this process may not mount (the test then runs itself in a namespace)."""
    root = meta_root(node)
    root.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(root)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        assert not os.environ.get(IN_NAMESPACE), f"no mount in the namespace: {mounted.stderr}"
        yield None
        return
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)


def test_a_read_only_metadata_dir_fails_the_prepare_and_rolls_back(
    node: Node, read_only_dir: Path | None, request: pytest.FixtureRequest
) -> None:
    if read_only_dir is None:
        # Unprivileged: this very test again, as root of its own user and mount namespace
        # (``unshare -rm``, as tests/e2e/test_storage.py mounts its tmpfs), never a skip.
        child = subprocess.run(
            ["unshare", "-rm", "--", sys.executable, "-m", "pytest", "-q", "-p",
             "no:cacheprovider", f"{__file__}::{request.node.name}"],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, IN_NAMESPACE: "1"})
        assert child.returncode == 0, child.stdout + child.stderr
        assert "1 passed" in child.stdout, child.stdout
        return
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert error.endswith(
        f"cannot write device metadata {meta_file(node, 'c1')}: "
        f"{read_only_dir / 'default_c1'}: Read-only file system")
    assert_nothing_left(node, claim)
    # The device is free again: another claim may take it (with the feature off).
    assert node.unprepare(claim)[uid_of(claim)].ok


def test_a_failed_spec_write_removes_the_metadata_files_written_before_it(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    shutil.rmtree(node.cdi_dir, ignore_errors=True)
    node.cdi_dir.write_text("a file where the CDI dir should be")
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert "CDI spec" in error or str(node.cdi_dir) in error
    assert not (meta_root(node) / "default_c1").exists()
    assert_nothing_left(node, claim)


# -- planted files --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "dangling-symlink", "fifo"])
def test_a_file_planted_at_the_metadata_path_is_replaced_never_followed(
    node: Node, tmp_path: Path, kind: str
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    path = meta_file(node, "c1")
    path.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    if kind == "symlink":
        victim.write_text("precious")
        path.symlink_to(victim)
    elif kind == "dangling-symlink":
        path.symlink_to(victim)
    else:
        os.mkfifo(path)
    assert in_thread(lambda: node.prepare(claim))[uid_of(claim)].ok
    assert path.is_file() and not path.is_symlink()
    assert json.loads(path.read_text())["metadata"]["name"] == "c1"
    if kind == "symlink":
        assert victim.read_text() == "precious"
    else:
        assert not victim.exists()


def test_a_directory_at_the_metadata_path_is_a_clear_error(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    (meta_file(node, "c1") / "inside").mkdir(parents=True)
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert f"cannot write device metadata {meta_file(node, 'c1')}" in error
    assert_nothing_left(node, claim)
    assert (meta_file(node, "c1") / "inside").is_dir()
    assert not [p for p in meta_file(node, "c1").parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("where", ["root", "claim", "request"])
def test_a_symlinked_directory_is_never_followed(
    node: Node, tmp_path: Path, where: str
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    link = {"root": meta_root(node), "claim": meta_root(node) / "default_c1",
            "request": meta_file(node, "c1").parent}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    link.symlink_to(victim)
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert f"{link} is a symbolic link (never followed)" in error
    assert list(victim.iterdir()) == []
    assert_nothing_left(node, claim)


def test_unprepare_after_a_directory_was_swapped_for_a_link_removes_nothing_else(
    node: Node, tmp_path: Path
) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    assert node.prepare(claim)[uid_of(claim)].ok
    request_dir = meta_file(node, "c1").parent
    meta_file(node, "c1").unlink()
    request_dir.rmdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "metadata.json").write_text("precious")
    request_dir.symlink_to(victim)
    assert node.unprepare(claim)[uid_of(claim)].ok
    assert (victim / "metadata.json").read_text() == "precious"
    assert uid_of(claim) not in decode(node.checkpoint.read_bytes()).claims


# -- names that would leave the directory ----------------------------------------------------


@pytest.mark.parametrize("annotation", ["../../etc", "a/b", "..", "UPPER", "x" * 64, "a\nb"])
def test_a_pod_claim_name_that_is_no_dns_label_fails_one_line(node: Node,
                                                               annotation: str) -> None:
    claim = make_claim("c1", ["gpu-0"])
    claim["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: annotation}
    node.book.put(claim)
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert "resource.kubernetes.io/pod-claim-name" in error and "DNS label" in error
    assert_nothing_left(node, claim)
    assert not meta_root(node).exists() or not any(meta_root(node).iterdir())


@pytest.mark.parametrize("request_name", ["../x", "a/..", "x/../../y", "Req", "a/b/c/.."])
def test_a_request_name_that_is_no_dns_label_fails_one_line(node: Node,
                                                             request_name: str) -> None:
    claim = node.book.put(make_claim("c1", [], results=[
        {"request": request_name, "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]))
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert "device metadata: request name" in error
    assert_nothing_left(node, claim)


@pytest.mark.parametrize(("namespace", "name"), [("default", "../x"), ("..", "c1"),
                                                 ("default", "a/b"), ("a_b", "c")])
def test_a_claim_name_that_would_leave_the_dir_is_refused_before_any_write(
    node: Node, namespace: str, name: str
) -> None:
    claim = node.book.put(make_claim(name, ["gpu-0"], namespace=namespace))
    error = one_line(node.prepare(claim)[uid_of(claim)].error)
    assert "DNS" in error
    assert not meta_root(node).exists()


def test_names_problem_accepts_what_the_api_server_allows() -> None:
    ref = ClaimRef("default", "c1", "u1")

    def result(request: str) -> AllocatedDevice:
        return AllocatedDevice(request=request, driver=DRIVER, pool="p", device="d")

    assert names_problem(ref, None, [result("gpu"), result("net/fast")]) is None
    assert names_problem(ref, "", [result("gpu")]) is None  # empty: as if absent
    assert names_problem(ref, "gpu-0", [result("a-1")]) is None
    assert names_problem(ref, None, [result("net/")]) is not None


def test_an_edited_checkpoint_naming_a_path_outside_is_corruption() -> None:
    from agent.checkpoint.model import ClaimRecord

    base = {"uid": "u1", "namespace": "default", "name": "c1", "state": "PrepareCompleted"}
    for bad in ({"requests": ["../../etc"]}, {"requests": ["ok"], "podClaimName": "a/b"},
                {"requests": "gpu"}, {"requests": [1]}, []):
        with pytest.raises(ValueError, match=r"deviceMetadata|requests|expected"):
            ClaimRecord.from_json("u1", {**base, "deviceMetadata": bad})
    doc = {"schemaVersion": 1, "claims": {"u1": {**base, "deviceMetadata":
                                                  {"requests": ["../x"]}}}}
    from agent.checkpoint.codec import checksum

    doc["checksum"] = checksum(doc)
    with pytest.raises(CheckpointCorruptError):
        decode(json.dumps(doc).encode())


# -- a claim name reused while the old claim is prepared -----------------------------------------


def test_a_recreated_claim_waits_until_the_old_one_is_unprepared(node: Node) -> None:
    old = node.book.put(make_claim("same", ["gpu-0"]))
    assert node.prepare(old)[uid_of(old)].ok
    before = meta_file(node, "same").read_bytes()
    new = node.book.put(make_claim("same", ["gpu-1"]))  # deleted and re-created: a new UID
    error = one_line(node.prepare(new)[uid_of(new)].error)
    assert f"still held by claim default/same ({uid_of(old)})" in error
    assert meta_file(node, "same").read_bytes() == before  # the old pod's file is intact
    assert_nothing_left(node, new)
    # The kubelet unprepares the failed claim too: the old claim's file stays.
    assert node.unprepare(new)[uid_of(new)].ok
    assert meta_file(node, "same").read_bytes() == before
    assert node.unprepare(old)[uid_of(old)].ok
    assert node.prepare(new)[uid_of(new)].ok
    assert json.loads(meta_file(node, "same").read_text())["metadata"]["uid"] == uid_of(new)
