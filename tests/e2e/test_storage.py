"""The node's disks misbehave: a CDI directory that cannot be written, a checkpoint that is
corrupt or written by a newer agent. The agent keeps running, says what happened, and an
unprepare still leaves nothing behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    Cluster,
    NodeDirs,
    assert_answer,
    assert_nothing_left,
    assert_prepared,
    claims_command,
    ref,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make ``directory`` refuse new and removed entries, even for root.

    Root ignores permission bits, so as root the directory is made immutable (``chattr +i``,
    EPERM on create, rename and unlink); otherwise mode 0555 gives EACCES.
    """
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True, capture_output=True)
    else:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)


def test_read_only_cdi_dir_fails_the_claim_and_leaves_no_trace(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    agent = start_agent()
    wait_registered(kubelet)
    first = cluster.allocate(cluster.create_claim("first"))
    second = cluster.allocate(cluster.create_claim("second"))
    f_uid, s_uid = first["metadata"]["uid"], second["metadata"]["uid"]
    assert_answer(first, kubelet.prepare(DRIVER, [ref(first)])[f_uid])
    files = dirs.cdi_files()

    with read_only(dirs.cdi):
        failed = kubelet.prepare(DRIVER, [ref(second)])[s_uid]
        assert failed.error and str(dirs.cdi) in failed.error, failed.error
        # No half-written spec, and no checkpoint record claiming the claim is prepared.
        assert dirs.cdi_files() == files
        assert dirs.records().get(s_uid, {}).get("state") != "PrepareCompleted"
        # Unprepare cannot remove the spec either: it says where, and keeps the record so
        # that the kubelet's retry still knows what to clean up.
        stuck = kubelet.unprepare(DRIVER, [ref(first)])[f_uid]
        assert stuck.error and str(dirs.cdi) in stuck.error, stuck.error
        assert dirs.cdi_files() == files
        assert dirs.records()[f_uid]["state"] == "PrepareCompleted"
        # An unrelated, already prepared claim keeps answering.
        assert_answer(first, kubelet.prepare(DRIVER, [ref(first)])[f_uid])
    assert agent.alive()

    # The disk is fixed; the kubelet retries both.
    assert_answer(second, kubelet.prepare(DRIVER, [ref(second)])[s_uid])
    assert_prepared(dirs, first, second)
    for claim in (first, second):
        assert kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok
    assert_nothing_left(dirs)
    assert agent.terminate() == 0


def test_full_cdi_disk_fails_the_claim_without_a_partial_file(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    # The agent gets its own mount namespace (a user namespace too, so no privilege is
    # needed) with a 32 KiB tmpfs on its CDI dir, seven pages of it already taken: a spec
    # bigger than the page left runs out of space half-way through its write. (32 KiB, not 16:
    # the claim's 16 requests each add a device metadata mount to the spec.)
    dirs.cdi.mkdir(parents=True)
    fill = ('mount -t tmpfs -o size=32k dra-e2e-cdi "$0" && head -c 28672 /dev/zero > "$0/.fill"'
            ' && exec "$@"')
    agent = start_agent(wrap=["unshare", "-rm", "--", "sh", "-c", fill, str(dirs.cdi)])
    wait_registered(kubelet)
    seen = NodeDirs(dirs.root, view=Path(f"/proc/{agent.pid}/root"))
    assert seen.cdi_files() == [".fill"]
    requests = [(f"gpu{i}", GPU_CLASS) for i in range(8)] + [(f"nic{i}", NIC_CLASS)
                                                           for i in range(8)]
    claim = cluster.allocate(cluster.create_claim("big", requests))
    uid = claim["metadata"]["uid"]

    failed = kubelet.prepare(DRIVER, [ref(claim)])[uid]
    assert failed.error and str(dirs.cdi) in failed.error, failed.error
    assert seen.cdi_files() == [".fill"]  # no partial spec, no temp file
    assert dirs.records().get(uid, {}).get("state") != "PrepareCompleted"

    # Space is freed; the kubelet's retry succeeds, and the spec did need more than a page.
    (seen.seen(dirs.cdi) / ".fill").unlink()
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert_prepared(seen, claim)
    assert seen.seen(dirs.spec_path(uid)).stat().st_size > 4096
    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(seen)
    assert agent.terminate() == 0


# --- corrupt checkpoints ----------------------------------------------------------------------


def sha256_checksum(doc: dict[str, object]) -> str:
    """The checksum rule of the file format, written out independently of the agent's code:
    SHA-256 over the canonical JSON of the document without its checksum key."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def truncated(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def wrong_checksum(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["checksum"] = "sha256:" + "0" * 64
    return json.dumps(doc).encode()


def garbage(raw: bytes) -> bytes:
    return bytes(range(256)) * 8


def future_schema(raw: bytes) -> bytes:
    """A newer agent's file: a higher version and optional fields this one does not know."""
    doc = json.loads(raw)
    doc["schemaVersion"] = 7
    doc["futureTopLevel"] = {"written-by": "dra-agent 9.0"}
    for record in doc["claims"].values():
        record["futureClaimField"] = ["kept"]
        for device in record["devices"]:
            device["futureDeviceField"] = 42
    doc["checksum"] = sha256_checksum(doc)
    return json.dumps(doc).encode()


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": truncated,
    "wrong-checksum": wrong_checksum,
    "garbage": garbage,
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_is_set_aside_and_unprepare_still_cleans_up(
    name: str, dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent,
    kubelet: KubeletStandIn,
) -> None:
    first = start_agent(name="before")
    wait_registered(kubelet)
    claim = cluster.allocate(cluster.create_claim("victim"))
    uid = claim["metadata"]["uid"]
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert first.terminate() == 0
    dirs.checkpoint.write_bytes(CORRUPTIONS[name](dirs.checkpoint.read_bytes()))

    since = len(kubelet.registrations)
    agent = start_agent(name="after")
    wait_registered(kubelet, since)
    agent.wait_http("/healthz")
    logs = agent.logs()
    assert "checkpoint corrupt" in logs and str(dirs.checkpoint) in logs, logs
    copies = list(dirs.plugin.glob("checkpoint.json.corrupt-*"))
    assert len(copies) == 1  # the evidence is kept for the operator
    # The devices stay taken until the claim is seen again.
    assert uid in dirs.records()

    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    # And the claim prepares cleanly afterwards, from the API object, not from salvage.
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert_prepared(dirs, claim)
    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    assert agent.terminate() == 0


def test_checkpoint_of_a_newer_agent_is_read_and_its_fields_kept(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    first = start_agent(name="before")
    wait_registered(kubelet)
    kept = cluster.allocate(cluster.create_claim("kept"))
    gone = cluster.allocate(cluster.create_claim("gone"))
    for claim in (kept, gone):
        assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]])
    assert first.terminate() == 0
    dirs.checkpoint.write_bytes(future_schema(dirs.checkpoint.read_bytes()))

    since = len(kubelet.registrations)
    agent = start_agent(name="after")
    wait_registered(kubelet, since)
    assert "corrupt" not in agent.logs()
    assert sorted(r["name"] for r in claims_command(dirs)) == ["gone", "kept"]

    # A repeated prepare answers from the record; an unprepare rewrites the file, keeping what
    # this version does not understand.
    k_uid = kept["metadata"]["uid"]
    assert_answer(kept, kubelet.prepare(DRIVER, [ref(kept)])[k_uid])
    assert kubelet.unprepare(DRIVER, [ref(gone)])[gone["metadata"]["uid"]].ok
    doc = dirs.checkpoint_doc()
    assert doc["schemaVersion"] == 7
    assert doc["futureTopLevel"] == {"written-by": "dra-agent 9.0"}
    assert sorted(doc["claims"]) == [k_uid]
    record = doc["claims"][k_uid]
    assert record["futureClaimField"] == ["kept"]
    assert all(d["futureDeviceField"] == 42 for d in record["devices"])
    assert doc["checksum"] == sha256_checksum(doc)

    assert kubelet.unprepare(DRIVER, [ref(kept)])[k_uid].ok
    assert dirs.cdi_files() == []
    assert dirs.records() == {}
    assert list(dirs.plugin.glob("*.corrupt-*")) == []
    assert agent.terminate() == 0
