"""``dra-agent run --simulate dgx-h100`` as a real process takes faults from outside it:
``dra-agent simulate fault`` (another process) makes a simulated GPU report an Xid or fall off
the bus, and the device's taint shows in the slice the agent publishes (the fake API server's);
``--recover`` clears it; bad files in the inbox are one warning line each and the agent carries
on serving."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.simfaults.writer import open_inbox
from tests.e2e.harness import (
    DRIVER,
    REPO,
    AgentProcess,
    Cluster,
    NodeDirs,
    reap,
    temporary_node_dirs,
    wait_for,
)
from tests.fakes.apiserver import FakeAPIServer

QUIET_S = "1"


@dataclass
class Node:
    dirs: NodeDirs
    cluster: Cluster
    agent: AgentProcess

    @property
    def inbox(self) -> Path:
        return self.dirs.plugin / "simulated-faults"

    def fault(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")}
        return subprocess.run(
            [sys.executable, "-m", "agent.cli", "simulate", "fault", *argv,
             "--kubelet-dir", str(self.dirs.kubelet)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=30, check=False)

    def taints(self, device: str) -> list[tuple[str, str, str]]:
        for piece in self.cluster.node_slices():
            for d in piece["spec"]["devices"]:
                if d["name"] == device:
                    return [(t["key"], t.get("value", ""), t["effect"])
                            for t in d.get("taints") or []]
        raise AssertionError(f"{device} is not published")

    def log_lines(self, message: str) -> list[str]:
        return [line for line in self.agent.logs().splitlines() if f'msg="{message}"' in line]


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One agent for the module (its start is most of the time): Xids taint NoExecute, as
    the cluster test wants for an eviction, and a fault clears after a second."""
    with temporary_node_dirs("f") as dirs, FakeAPIServer() as server:
        cluster = Cluster(server, dirs.root)
        agent = AgentProcess(dirs, cluster.kubeconfig, "--health-quiet-period", QUIET_S,
                             "--health-taint-effects", "xid=NoExecute")
        try:
            # No kubelet here to confirm the registration (/readyz waits for it): the slices
            # are what the tests read.
            agent.wait_http("/readyz/slices")
            yield Node(dirs, cluster, agent)
        finally:
            reap([agent])


def test_an_xid_from_outside_taints_the_published_device(node: Node) -> None:
    assert node.taints("gpu-3") == []
    out = node.fault("gpu-3", "--xid", "79")
    assert (out.returncode, out.stdout, out.stderr) == (0, "gpu-3: Xid 79 delivered\n", "")
    want = [(f"{DRIVER}/xid", "79", "NoExecute")]
    assert wait_for("xid taint", lambda: node.taints("gpu-3") == want)
    assert node.taints("gpu-2") == []  # only that GPU
    [line] = [x for x in node.log_lines("simulated fault delivered") if "device=gpu-3 " in x]
    assert "fault=xid xid=79 " in line and "effect=NoExecute" in line


def test_a_lost_gpu_stays_tainted_until_it_recovers(node: Node) -> None:
    assert node.fault("gpu-5", "--lost").returncode == 0
    lost = (f"{DRIVER}/gpu-lost", "", "NoSchedule")
    assert wait_for("lost taint", lambda: lost in node.taints("gpu-5"))
    out = node.fault("gpu-5", "--recover")
    assert (out.returncode, out.stdout) == (0, "gpu-5: recover delivered\n")
    # The watcher probes a lost GPU every 5 s, the quiet period passes, and a device's taints
    # change at most once in 5 s (the Xid 79 of the fall went first): about 10 s.
    assert wait_for("recovery", lambda: node.taints("gpu-5") == [], timeout=25)


def test_bad_inbox_files_are_warned_about_and_the_agent_keeps_serving(node: Node) -> None:
    inbox = node.inbox
    open_inbox(inbox)  # as the first writer does
    (inbox / "bad.json").write_text("{not json")
    (inbox / "huge.json").write_bytes(b" " * 100_000)
    (inbox / "link.json").symlink_to("/dev/zero")
    (inbox / "dir.json").mkdir()
    os.mkfifo(inbox / "fifo.json")
    wait_for("the files moved aside",
             lambda: not [n for n in os.listdir(inbox) if not n.startswith(".")])
    refused = node.log_lines("simulated fault refused")
    for name, reason in (("bad.json", "not JSON"), ("huge.json", "over the 4096-byte cap"),
                         ("link.json", "symbolic link"), ("dir.json", "is a directory"),
                         ("fifo.json", "is a FIFO")):
        [line] = [r for r in refused if f"file={name} " in r]  # one line each
        assert reason in line and "level=warning" in line
        assert os.path.lexists(inbox / ".rejected" / name)
    out = node.fault("gpu-99", "--ecc")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: the agent refused double-bit ECC error for gpu-99: no "
                                 "device gpu-99 on this node"), out.stderr
    assert "Traceback" not in node.agent.logs()
    # Still serving, and still taking faults.
    assert node.agent.url("/healthz")[0] == 200
    assert node.fault("gpu-1", "--ecc").returncode == 0
    assert wait_for("ecc taint",
                    lambda: node.taints("gpu-1") == [(f"{DRIVER}/ecc", "double-bit",
                                                      "NoSchedule")])
