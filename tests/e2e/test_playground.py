"""hack/playground.sh shows the whole flow and leaves nothing running or on disk."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import REPO


def test_playground_shows_the_flow_and_cleans_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")}
    env["PYTHON"] = sys.executable
    out = subprocess.run(["bash", str(REPO / "hack" / "playground.sh")], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    text = out.stdout
    assert out.returncode == 0, text + out.stderr
    for title in ("kubelet: plugin registration", "ResourceSlices published by the agent",
                  "user: a ResourceClaim for a GPU and a NIC under one PCIe root",
                  "scheduler: allocate", "kubelet: NodePrepareResources",
                  "CDI spec written by the agent", "kubelet: NodeUnprepareResources"):
        assert f"=== {title}" in text, title
    assert "20 devices" in text
    # The allocation pairs a GPU with the NIC under its PCIe root, and the kubelet got both.
    prepared = re.findall(r"^(gpu|nic): playground/(\S+) -> (k8s\.dra-agent\.io/claim=\S+)$",
                          text, re.M)
    assert [p[0] for p in prepared] == ["gpu", "nic"]
    rows = {m[0]: m[1] for m in re.findall(r"^  ((?:gpu|nic)-\S+)\s+\w+\s+(pci\S+)", text, re.M)}
    assert rows[prepared[0][1]] == rows[prepared[1][1]]
    assert '"cdiVersion"' in text and "DRA_AGENT_CLAIM_UID=" in text
    assert "unprepared; CDI specs left: 0, checkpoint records left: 0" in text

    # Nothing left behind: the work dir is gone and so are the processes it started.
    work = Path(re.search(r"^work dir: (\S+)$", text, re.M)[1])  # type: ignore[index]
    assert not work.exists()
    assert "cleaned up: stopped 2 processes" in text
    pids = [int(p) for p in re.findall(r"\(pid (\d+)", text)]
    assert len(pids) == 2
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text()


def test_ctrl_c_in_the_middle_still_cleans_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")}
    env["PYTHON"] = sys.executable
    # Its own session, so the interrupt reaches the whole job as a terminal's Ctrl-C does.
    proc = subprocess.Popen(["bash", str(REPO / "hack" / "playground.sh")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("dra-agent run"):  # both processes are up
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=60)
    text = "".join(lines) + rest
    assert proc.returncode != 0, text
    work = Path(re.search(r"^work dir: (\S+)$", text, re.M)[1])  # type: ignore[index]
    assert not work.exists(), text
    assert "cleaned up: stopped 2 processes" in text
    for pid in (int(p) for p in re.findall(r"\(pid (\d+)", text)):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text()
