"""``dra-agent simulate fault``: what it writes, what it says, and its exit codes (0 delivered;
2 bad input, no simulated agent, refused by the agent; 1 not taken in time), against an
in-process inbox of a simulated node (tests/daemon/test_simulated_faults.py runs the real
agent)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agent.cli import main
from agent.health.options import HealthOptions
from agent.simfaults.inbox import FaultInbox
from agent.simfaults.layout import REJECTED_SUBDIR, agent_lock_path
from discovery.model import Inventory
from discovery.scan import discover
from discovery.simulate import scratch_dir, simulated_sources

DRIVER = "dra-agent.io"


def inbox_dir(kubelet: Path) -> Path:
    return kubelet / "plugins" / DRIVER / "simulated-faults"


def fault(kubelet: Path, *argv: str) -> Result:
    return CliRunner().invoke(main, ["simulate", "fault", *argv, "--kubelet-dir", str(kubelet)],
                              catch_exceptions=False)


def one_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    """A simulated DGX H100's inbox served in this process, as the agent serves it; yields
    the kubelet dir."""
    kubelet = tmp_path / "kubelet"
    stop = threading.Event()
    with scratch_dir() as work:
        sources = simulated_sources("dgx-h100", Path(work))
        inventory = discover(sources)
        assert sources.gpu is not None
        sources.gpu.init()
        sources.gpu.event_set_create()
        inbox = FaultInbox(inbox_dir(kubelet), sources.gpu, lambda: inventory,
                           health=HealthOptions(), stop=stop, poll_s=0.02)
        thread = inbox.start()
        assert thread is not None
        try:
            yield kubelet
        finally:
            stop.set()
            thread.join(5)


def test_a_fault_is_delivered(agent: Path) -> None:
    result = fault(agent, "gpu-3", "--xid", "79")
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "gpu-3: Xid 79 delivered\n", "")
    for flag, said in (("--ecc", "double-bit ECC error"), ("--lost", "lost"),
                       ("--recover", "recover")):
        result = fault(agent, "gpu-2", flag)
        assert (result.exit_code, result.stdout) == (0, f"gpu-2: {said} delivered\n")
    assert not [n for n in os.listdir(inbox_dir(agent)) if not n.startswith(".")]


def test_a_refused_fault_says_the_agents_reason(agent: Path) -> None:
    line = one_error(fault(agent, "gpu-9", "--xid", "79"), 2)
    assert line == ("error: the agent refused Xid 79 for gpu-9: no device gpu-9 on this node; "
                    "its GPU and MIG devices: gpu-0, gpu-1, gpu-2, gpu-3, gpu-4, gpu-5, "
                    "gpu-6, gpu-7")
    line = one_error(fault(agent, "nic-0000-18-00-0", "--ecc"), 2)
    assert "nic-0000-18-00-0 is a nic device: simulated faults are NVML's" in line
    assert len(os.listdir(inbox_dir(agent) / REJECTED_SUBDIR)) == 4  # two, with their reasons


def test_without_a_simulated_agent_it_is_one_line_and_exit_2(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    line = one_error(fault(kubelet, "gpu-3", "--xid", "79"), 2)
    lock = agent_lock_path(inbox_dir(kubelet))
    assert line == (f"error: no simulated agent on this node: {lock} does not exist: no "
                    "'dra-agent run --simulate' ran here (are --kubelet-dir and --driver-name "
                    "the agent's?)")
    # An agent ran and stopped: its lock is there, held by no one.
    lock.parent.mkdir(parents=True)
    lock.touch()
    line = one_error(fault(kubelet, "gpu-3", "--ecc"), 2)
    assert f"no running agent holds {lock}: the 'dra-agent run --simulate' here stopped" in line
    assert not inbox_dir(kubelet).exists()  # nothing written


@pytest.mark.parametrize("argv, said", [
    (["gpu-3"], "give exactly one fault: --xid N, --ecc, --lost or --recover"),
    (["gpu-3", "--xid", "79", "--lost"], "give exactly one fault"),
    (["GPU_3", "--ecc"], "device 'GPU_3': must be a DNS label"),
    (["gpu-3", "--xid", "0"], "Invalid value for '--xid'"),
    (["gpu-3", "--xid", "x"], "Invalid value for '--xid'"),
    (["gpu-3", "--ecc", "--wait", "-1"], "Invalid value for '--wait'"),
    (["--ecc"], "Missing argument 'DEVICE'"),
], ids=["none", "two", "bad-name", "xid-0", "xid-text", "wait-negative", "no-device"])
def test_bad_input_is_one_line_and_exit_2(agent: Path, argv: list[str], said: str) -> None:
    assert said in one_error(fault(agent, *argv), 2)
    assert not inbox_dir(agent).exists()  # nothing written


def test_a_request_not_taken_in_time_is_withdrawn(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    inbox = inbox_dir(kubelet)
    lock = agent_lock_path(inbox)
    lock.parent.mkdir(parents=True)
    import fcntl

    with lock.open("w") as held:  # an agent that holds its lock but takes nothing
        fcntl.flock(held, fcntl.LOCK_SH)
        line = one_error(fault(kubelet, "gpu-3", "--xid", "79", "--wait", "0.2"), 1)
        assert line.startswith("error: the agent did not take the request within 0.2 s, so it "
                               "was withdrawn: is 'dra-agent run --simulate' running with "
                               f"--kubelet-dir {kubelet} and --driver-name {DRIVER}?")
        assert [n for n in os.listdir(inbox) if not n.startswith(".")] == []
        # --wait 0 leaves it queued for the agent.
        result = fault(kubelet, "gpu-3", "--lost", "--wait", "0", "-v")
        assert result.exit_code == 0, result.output
        (name,) = [n for n in os.listdir(inbox) if not n.startswith(".")]
        assert result.stdout == f"gpu-3: lost queued ({inbox / name})\n"
        assert result.stderr == f"request {inbox / name}\n"
        assert json.loads((inbox / name).read_text()) == {"device": "gpu-3", "fault": "lost"}


def test_a_symlink_at_the_inbox_is_not_followed(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    inbox = inbox_dir(kubelet)
    lock = agent_lock_path(inbox)
    lock.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    inbox.symlink_to(elsewhere)
    import fcntl

    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        line = one_error(fault(kubelet, "gpu-3", "--ecc"), 1)
    assert line.startswith(f"error: cannot use the inbox {inbox}: not a directory")
    assert list(elsewhere.iterdir()) == []


def test_the_shared_options_reach_it(agent: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["simulate", "fault", "gpu-1", "--ecc"],
                                env={"DRA_AGENT_KUBELET_DIR": str(agent)})
    assert result.exit_code == 0, result.output
    conf = tmp_path / "c.yaml"
    conf.write_text(f"kubelet-dir: {agent}\nmetrics-address: none\nsimulate: dgx-h100\n")
    result = CliRunner().invoke(main, ["simulate", "fault", "gpu-1", "--ecc", "--config",
                                       str(conf)])
    assert result.exit_code == 0, result.output
    # Another driver name is another plugin dir: no agent there.
    result = fault(agent, "gpu-1", "--ecc", "--driver-name", "gpu.example.com")
    assert "plugins/gpu.example.com/simulated-faults.lock does not exist" in one_error(result, 2)


def test_the_command_imports_no_simulation_and_no_grpc() -> None:
    """It only writes a file: none of the simulator or the kubelet plugin is loaded."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import sys; from agent.cli import main\n"
         "try:\n"
         "    main(['simulate', 'fault', 'gpu-1', '--ecc', '--kubelet-dir', '/nonexistent'])\n"
         "except SystemExit:\n    pass\n"
         "print(sorted(m for m in sys.modules if m.startswith(('discovery.simulate', 'grpc'))))"],
        capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_quiet_inbox_is_looked_into_less_often(tmp_path: Path) -> None:
    """``poll_s`` for ``BUSY_S`` after the start and after each request, ``idle_poll_s`` once
    quiet that long: an idle simulated agent wakes once a second, not five times."""
    from agent.simfaults.inbox import BUSY_S

    now = [0.0]
    polls: list[float] = []

    class Counting(FaultInbox):
        def poll(self) -> int:
            polls.append(now[0])
            return super().poll()

    stop = threading.Event()
    inbox = Counting(tmp_path / "inbox", None, lambda: Inventory(devices=()),
                     health=HealthOptions(), stop=stop, poll_s=0.01, idle_poll_s=3600,
                     clock=lambda: now[0])
    thread = threading.Thread(target=inbox.run)
    thread.start()
    try:
        assert not stop.wait(0.3)
        busy = len(polls)
        now[0] = BUSY_S + 1  # quiet for longer than BUSY_S
        assert not stop.wait(0.3)
        quiet = len(polls) - busy
    finally:
        stop.set()
        thread.join(5)
    assert busy >= 5, polls
    # The round under way when the clock moved may take one more look; then 3600 s.
    assert quiet <= 2, polls
