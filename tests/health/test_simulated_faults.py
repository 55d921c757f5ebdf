"""The simulated agent's fault inbox (agent/simfaults/) in-process: a request written as
``dra-agent simulate fault`` writes it reaches the NVML fake, and the GPU watcher sees it as a
real fault; a bad or hostile entry is one warning line, moved aside, never an exception."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.health.gpu import GpuWatcher, Mode
from agent.health.model import Kind
from agent.health.options import HealthOptions
from agent.simfaults.inbox import MAX_REJECTED, FaultInbox
from agent.simfaults.layout import REASON_SUFFIX, REJECTED_SUBDIR, agent_lock_path, inbox_lock
from agent.simfaults.request import (
    MAX_REQUEST_BYTES,
    FaultKind,
    FaultRequest,
    FaultRequestError,
    parse_request,
)
from agent.simfaults.writer import (
    Outcome,
    agent_problem,
    open_inbox,
    outcome,
    withdraw,
    write_request,
)
from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover
from tests.health.conftest import FakeClock, Node, RecordingSink

FAST = HealthOptions(gpu_wait_ms=20, gpu_poll_s=1.0, gpu_retry_s=1.0)


def inbox_for(node: Node, tmp_path: Path, health: HealthOptions | None = FAST,
              inventory: Callable[[], Inventory] | None = None,
              stop: threading.Event | None = None) -> FaultInbox:
    directory = tmp_path / "simulated-faults"
    open_inbox(directory)
    return FaultInbox(directory, node.sources.gpu, inventory or node.provider(),
                      health=health, stop=stop or threading.Event())


def watcher(node: Node) -> tuple[GpuWatcher, RecordingSink]:
    sink = RecordingSink()
    w = GpuWatcher(node.nvml, FAST, sink, inventory=node.provider(), stop=threading.Event(),
                   clock=FakeClock())
    w.setup()
    return w, sink


def send(inbox: FaultInbox, device: str, fault: FaultKind, xid: int | None = None) -> str:
    return write_request(inbox.directory, FaultRequest(device, fault, xid))


def simfault_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agent.simfaults"]


def test_an_xid_request_reaches_the_watcher_and_is_consumed(
        h100: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w, sink = watcher(h100)
    inbox = inbox_for(h100, tmp_path)
    caplog.set_level(logging.INFO, "agent.simfaults")
    name = send(inbox, "gpu-3", FaultKind.XID, 79)
    assert outcome(inbox.directory, name) == (Outcome.PENDING, "")
    assert inbox.poll() == 1
    w.step()
    [(devices, _, cond)] = sink.events
    assert devices == ("gpu-3",) and (cond.kind, cond.value) == (Kind.XID, "79")
    assert outcome(inbox.directory, name) == (Outcome.DELIVERED, "")
    assert sorted(os.listdir(inbox.directory)) == [".lock"]  # consumed, nothing left
    [record] = simfault_records(caplog)
    assert record.getMessage() == "simulated fault delivered"
    assert (record.device, record.fault, record.xid, record.effect) == (
        "gpu-3", "xid", "79", "NoSchedule")


def test_ecc_and_lost_and_recover(h100: Node, tmp_path: Path) -> None:
    w, sink = watcher(h100)
    inbox = inbox_for(h100, tmp_path)
    send(inbox, "gpu-6", FaultKind.ECC)
    inbox.poll()
    w.step()
    [(devices, _, cond)] = sink.events
    assert devices == ("gpu-6",) and (cond.kind, cond.value) == (Kind.ECC, "double-bit")
    uuid = h100.device("gpu-5").host.uuid
    send(inbox, "gpu-5", FaultKind.LOST)
    inbox.poll()
    (gpu,) = [g for g in h100.nvml.gpus if g.uuid == uuid]
    assert gpu.lost
    for _ in range(3):
        w.step()
    assert w.modes()[uuid] is Mode.LOST
    send(inbox, "gpu-5", FaultKind.RECOVER)
    inbox.poll()
    assert not gpu.lost
    assert h100.nvml.device_memory_total(h100.nvml.device_handle_by_index(gpu.index)) > 0


def test_a_mig_device_names_its_instance_and_lost_takes_its_gpu(
        a100: Node, tmp_path: Path) -> None:
    w, sink = watcher(a100)
    inbox = inbox_for(a100, tmp_path)
    mig = "gpu-3-mig-1c3g40gb-0-ci1"
    send(inbox, mig, FaultKind.XID, 94)
    inbox.poll()
    w.step()
    [(devices, _, cond)] = sink.events
    assert devices == (mig,) and cond.value == "94"
    parent = a100.device(mig).host.parent_uuid
    send(inbox, mig, FaultKind.LOST)
    inbox.poll()
    (gpu,) = [g for g in a100.nvml.gpus if g.uuid == parent]
    assert gpu.lost


def test_a_partition_without_an_instance_takes_no_xid(
        node_factory: Callable[[str], Node], tmp_path: Path) -> None:
    node = node_factory("dgx-h100-mig")
    inventory = discover(node.sources, DiscoveryOptions(mig="dynamic"))
    inbox = inbox_for(node, tmp_path, inventory=lambda: inventory)
    name = send(inbox, "gpu-0-mig-1g10gb-0", FaultKind.XID, 79)
    inbox.poll()
    state, reason = outcome(inbox.directory, name)
    assert state is Outcome.REFUSED
    assert reason.startswith("gpu-0-mig-1g10gb-0 is a MIG partition without an instance yet")


def test_an_ignored_xid_is_delivered_with_a_note(
        h100: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    inbox = inbox_for(h100, tmp_path)
    caplog.set_level(logging.INFO, "agent.simfaults")
    send(inbox, "gpu-0", FaultKind.XID, 13)
    inbox.poll()
    [record] = simfault_records(caplog)
    assert record.note == "Xid 13 is ignored (--health-ignore-xids): no taint"


def _symlink(path: Path) -> None:
    path.symlink_to("/etc/passwd")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "request.json").write_text('{"device": "gpu-1", "fault": "ecc"}')


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "bad-json": (lambda p: p.write_text("{bad"), "not JSON: Expecting property name"),
    "binary": (lambda p: p.write_bytes(b"\xff\x00"), "not UTF-8 text"),
    "list": (lambda p: p.write_text("[1]"), "not a JSON object like"),
    "unknown-key": (lambda p: p.write_text('{"device": "gpu-1", "fault": "xid", "xid": 79, '
                                           '"evil": 1}'), "unknown key(s) 'evil'"),
    "bad-fault": (lambda p: p.write_text('{"device": "gpu-1", "fault": "melt"}'),
                  "fault 'melt' is not one of xid, ecc, lost, recover"),
    "xid-bool": (lambda p: p.write_text('{"device": "gpu-1", "fault": "xid", "xid": true}'),
                 "xid must be a number from 1 to"),
    "xid-on-ecc": (lambda p: p.write_text('{"device": "gpu-1", "fault": "ecc", "xid": 4}'),
                   "xid is only for the fault xid"),
    "bad-name": (lambda p: p.write_text('{"device": "GPU 1\\n", "fault": "ecc"}'),
                 "must be a DNS label"),
    "deep": (lambda p: p.write_text("[" * 2000 + "]" * 2000), "not JSON: nested too deeply"),
    "huge": (lambda p: p.write_bytes(b" " * (MAX_REQUEST_BYTES + 1)), "over the 4096-byte cap"),
    "symlink": (_symlink, "is a symbolic link (never followed)"),
    "directory": (_directory, "is a directory, not a regular file"),
    "fifo": (_fifo, "is a FIFO, not a regular file"),
    "unknown-device": (lambda p: p.write_text('{"device": "gpu-99", "fault": "ecc"}'),
                       "no device gpu-99 on this node; its GPU and MIG devices: gpu-0, gpu-1,"),
    "nic": (lambda p: p.write_text('{"device": "nic-0000-18-00-0", "fault": "ecc"}'),
            "nic-0000-18-00-0 is a nic device: simulated faults are NVML's"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_bad_entry_is_one_warning_and_moved_aside(
        h100: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    make, reason = HOSTILE[case]
    inbox = inbox_for(h100, tmp_path)
    make(inbox.directory / case)
    caplog.set_level(logging.INFO, "agent.simfaults")
    assert inbox.poll() == 1
    [record] = simfault_records(caplog)
    assert record.levelno == logging.WARNING and record.getMessage() == "simulated fault refused"
    assert reason in record.reason
    assert record.exc_info is None
    assert sorted(os.listdir(inbox.directory)) == [".lock", REJECTED_SUBDIR]
    rejected = inbox.directory / REJECTED_SUBDIR
    assert os.path.lexists(rejected / case)
    assert reason in (rejected / (case + REASON_SUFFIX)).read_text()
    assert outcome(inbox.directory, case)[0] is Outcome.REFUSED
    caplog.clear()
    assert inbox.poll() == 0 and simfault_records(caplog) == []  # said once


def test_health_off_refuses_every_request(h100: Node, tmp_path: Path) -> None:
    inbox = inbox_for(h100, tmp_path, health=None)
    name = send(inbox, "gpu-1", FaultKind.XID, 79)
    inbox.poll()
    assert outcome(inbox.directory, name) == (
        Outcome.REFUSED, "device health monitoring is off (--no-health): nothing would see the "
        "fault")


def test_the_rejected_entries_are_capped(h100: Node, tmp_path: Path) -> None:
    inbox = inbox_for(h100, tmp_path)
    for i in range(MAX_REJECTED):
        (inbox.directory / f"bad-{i:03d}").write_text("nope")
    while inbox.poll():
        pass
    assert len(os.listdir(inbox.directory / REJECTED_SUBDIR)) == MAX_REJECTED


def test_a_held_inbox_lock_defers_the_poll_and_the_writer_withdraws(
        h100: Node, tmp_path: Path) -> None:
    inbox = inbox_for(h100, tmp_path)
    name = send(inbox, "gpu-1", FaultKind.ECC)
    with inbox_lock(inbox.directory) as locked:  # the other agent of a rolling update polls
        assert locked
        assert inbox.poll() == 0
    assert withdraw(inbox.directory, name)
    assert not withdraw(inbox.directory, name)
    assert inbox.poll() == 0


def test_the_agent_lock_says_whether_an_agent_runs(h100: Node, tmp_path: Path) -> None:
    assert "does not exist" in str(agent_problem(tmp_path / "elsewhere" / "simulated-faults"))
    stops = [threading.Event(), threading.Event()]
    # Two agents (a rolling update's) share the lock.
    inboxes = [inbox_for(h100, tmp_path, stop=stop) for stop in stops]
    threads = [inbox.start() for inbox in inboxes]
    directory = inboxes[0].directory
    assert agent_lock_path(directory).is_file()
    assert agent_problem(directory) is None
    stops[0].set()
    threads[0].join(5)
    assert agent_problem(directory) is None
    stops[1].set()
    threads[1].join(5)
    assert "the 'dra-agent run --simulate' here stopped" in str(agent_problem(directory))


def test_requests_round_trip_and_bad_ones_are_refused() -> None:
    request = FaultRequest("gpu-3", FaultKind.XID, 79)
    assert json.loads(request.to_json()) == {"device": "gpu-3", "fault": "xid", "xid": 79}
    assert parse_request(request.to_json()) == request
    assert parse_request(b'{"device": "gpu-3", "fault": "recover"}').describe() == "recover"
    with pytest.raises(FaultRequestError, match="xid must be a number"):
        FaultRequest("gpu-3", FaultKind.XID, 0)
    with pytest.raises(FaultRequestError, match="must be a non-empty string"):
        parse_request(b'{"device": "", "fault": "ecc"}')
