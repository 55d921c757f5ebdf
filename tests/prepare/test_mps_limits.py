"""MPS shares (opaque config ``sharing.mps``), #28 finding 8: the pipe directory only in the
containers of MPS shares, and the limits set on the server side where MPS allows it.

A client's ``CUDA_MPS_*`` variables only lower its bound; the control daemon's per-server and
default limits are what it cannot raise. One server serves every client of a UID, so the
server side holds each share to the largest bound among the prepared MPS shares
(``agent.prepare.mpscontrol`` has the facts and their sources): these tests hold the agent
to that, to the record naming a limit before the daemon gets it, and to a salvaged or
malformed record never reaching the daemon with a number of its own.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
from agent.claim.parse import parse_claim
from agent.prepare.effects.mps import MpsEffect
from agent.prepare.mpscontrol import MpsControlError, NvidiaMpsControl, RecordingMpsControl
from cdi.edits import EditsProvider
from discovery.model import Device, Inventory
from discovery.sharing import parse_sharing, shareable
from tests.cdi import conftest as cdifix
from tests.cdi.fakeroot import FakeHost
from tests.plugnode import DRIVER, NODE, Node, build_node, device_preparer, make_claim
from tests.prepare.test_share_enforcement import UUID0, _nvidia, share_claim, uid

PIPE = Path("/tmp/nvidia-mps")  # MPS's default pipe directory, as the operator's daemon has it
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"


def mps_config() -> list[dict[str, Any]]:
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
        "sharing": {"mps": True}}}}]


def all_mounts(spec: dict[str, Any]) -> list[str]:
    """Every container path a claim spec mounts, common edits and per-device edits."""
    edits = [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]
    return [m["containerPath"] for e in edits for m in e.get("mounts", [])]


# -- the pipe directory: only MPS shares get it -----------------------------------------------


def test_only_mps_shares_get_the_mps_pipe_directory(tmp_path: Path) -> None:
    """A plain NVIDIA claim's spec has no MPS pipe mount (it would hand the tenant the node's
    control pipe); an MPS share's has exactly one, the share's own."""
    host = FakeHost(tmp_path / "host")
    for d in (host.root, host.dev, host.proc, host.sys):
        d.mkdir(parents=True)
    host.install_driver()
    host.make_control_nodes()
    host.add_gpu(0, "0000:1b:00.0")
    host.add_gpu(1, "0000:1c:00.0")
    (host.root / PIPE.relative_to("/")).mkdir(parents=True)  # the daemon's pipe directory
    shared, _ = shareable(replace(cdifix.gpu("gpu-0", 0, "0000:1b:00.0"),
                                  capacity={"memory": "80Gi"}), parse_sharing("gpu=shares:4"))
    assert shared is not None
    inventory = Inventory(devices=(shared, cdifix.gpu("gpu-1", 1, "0000:1c:00.0")))
    preparer = device_preparer(
        tmp_path, lambda: inventory, mps_pipe_dir=PIPE, mps_control=RecordingMpsControl(),
        edits=EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys))

    plain = preparer.prepare(parse_claim(make_claim("plain", ["gpu-1"])))
    share = preparer.prepare(parse_claim(make_claim("share", results=[{
        "request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
        "shareID": "00000000-0000-4000-8000-000000000001", "consumedCapacity": {"shares": "1"}}],
        config=mps_config())))

    def mounts(record: ClaimRecord) -> list[str]:
        return all_mounts(json.loads(Path(record.spec_path).read_text()))

    assert str(PIPE) not in mounts(plain)
    assert mounts(share).count(str(PIPE)) == 1


# -- server-side limits -------------------------------------------------------------------------


@pytest.fixture
def node(short_root: Path) -> Iterator[Node]:
    n = build_node(short_root, mps_pipe_dir=PIPE)
    n.mps_control = RecordingMpsControl()
    n.inventory[0] = _nvidia(n.inventory[0], "gpu=shares:4")
    n.restart()
    yield n
    n.kubelet.stop()
    n.server.stop(0)


def stored(node: Node, claim: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(node.checkpoint.read_text())["claims"][uid(claim)]
    return record


def test_mps_shares_hold_the_server_to_the_largest_share_and_reset_after_the_last(
        node: Node) -> None:
    control = node.mps_control
    a = share_claim(node, "a", 1, {"shares": "1"}, mps=True)
    b = share_claim(node, "b", 2, {"shares": "3"}, mps=True)
    assert node.prepare(a)[uid(a)].ok
    assert control.thread_percentage == 25
    assert stored(node, a)["devices"][0]["mpsLimit"] == {"activeThreadPercentage": 25}
    assert node.prepare(b)[uid(b)].ok
    assert control.thread_percentage == 75  # one server for both: no lower than b's share
    assert node.unprepare(b)[uid(b)].ok
    assert control.thread_percentage == 25  # a's clients from now on get a's share again
    assert node.unprepare(a)[uid(a)].ok
    assert control.thread_percentage == 100  # MPS's own default: nothing bounded
    assert control.pinned_mib == {}  # shares of threads never touch the memory limits


def test_mps_memory_shares_bound_the_gpus_pinned_memory(short_root: Path) -> None:
    n = build_node(short_root, mps_pipe_dir=PIPE)
    try:
        n.mps_control = control = RecordingMpsControl()
        n.inventory[0] = _nvidia(n.inventory[0], "gpu=memory:10Gi", memory="80Gi")
        n.restart()
        a = share_claim(n, "a", 1, {"memory": "20Gi"}, mps=True)
        b = share_claim(n, "b", 2, {"memory": "30Gi"}, mps=True)
        assert n.prepare(a)[uid(a)].ok and n.prepare(b)[uid(b)].ok
        assert control.pinned_mib == {UUID0: 30720}
        assert stored(n, a)["devices"][0]["mpsLimit"] == {"pinnedMemoryMiB": 20480}
        assert n.unprepare(b)[uid(b)].ok
        assert control.pinned_mib == {UUID0: 20480}
        assert n.unprepare(a)[uid(a)].ok
        assert control.pinned_mib == {UUID0: 81920}  # the whole GPU: no limit below it
        assert control.thread_percentage is None  # memory shares leave the threads alone
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_the_record_names_the_limit_before_the_daemon_gets_it(node: Node) -> None:
    seen: list[object] = []

    class Watching(RecordingMpsControl):
        def set_active_thread_percentage(self, percent: int) -> None:
            claims = json.loads(node.checkpoint.read_text())["claims"]
            seen.append([d.get("mpsLimit") for r in claims.values() for d in r["devices"]])
            super().set_active_thread_percentage(percent)

    node.mps_control = Watching()
    node.restart()
    a = share_claim(node, "a", 1, {"shares": "2"}, mps=True)
    assert node.prepare(a)[uid(a)].ok
    assert seen == [[{"activeThreadPercentage": 50}]]


def test_a_daemon_refusing_the_limit_fails_the_claim_and_leaves_nothing(node: Node) -> None:
    node.mps_control.failure = "Cannot find MPS control daemon process"
    a = share_claim(node, "a", 1, {"shares": "1"}, mps=True)
    error = node.prepare(a)[uid(a)].error
    assert error.endswith("device gpu-0: the MPS control daemon refused active thread "
                          "percentage 25: Cannot find MPS control daemon process")
    assert "\n" not in error
    assert json.loads(node.checkpoint.read_text())["claims"] == {}
    assert not (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(a)}.json").exists()


def test_no_mps_control_on_the_node_is_one_line(short_root: Path) -> None:
    n = build_node(short_root, mps_pipe_dir=PIPE)  # a pipe directory, no control binary
    try:
        n.inventory[0] = _nvidia(n.inventory[0], "gpu=shares:4")
        n.restart()
        a = share_claim(n, "a", 1, {"shares": "1"}, mps=True)
        assert n.prepare(a)[uid(a)].error.endswith(
            "opaque config sharing.mps: no nvidia-cuda-mps-control on this node to set the MPS "
            "server's limits with, so the share's bound would be its containers' to change")
    finally:
        n.kubelet.stop()
        n.server.stop(0)


# -- start-up: the completed records, and what the agent cannot trust --------------------------


def _gpu(name: str, uuid: str) -> Device:
    d, _ = shareable(replace(cdifix.gpu(name), host=replace(cdifix.gpu(name).host, uuid=uuid),
                             capacity={"memory": "80Gi"}), parse_sharing("gpu=shares:4"))
    assert d is not None
    return d


def record(uid_: str, device: str, limit: object, *, recovered: bool = False) -> ClaimRecord:
    held = PreparedDevice(pool=NODE, device=device, requests=("req",),
                          extra={"mpsLimit": limit})
    return ClaimRecord(uid=uid_, namespace="default" if not recovered else "",
                       name=uid_ if not recovered else "", state=ClaimState.PREPARE_COMPLETED,
                       devices=(held,), recovered=recovered)


def effect(control: RecordingMpsControl) -> MpsEffect:
    inventory = Inventory(devices=(_gpu("gpu-0", UUID0), _gpu("gpu-1", UUID1)))
    return MpsEffect(PIPE, control, lambda: inventory)


def test_start_up_sets_the_limits_the_completed_records_name() -> None:
    control = RecordingMpsControl()
    claims = {"a": record("a", "gpu-0", {"activeThreadPercentage": 25}),
              "b": record("b", "gpu-1", {"activeThreadPercentage": 50})}
    effect(control).reconcile(claims, corrupt=False)
    assert control.thread_percentage == 50


@pytest.mark.parametrize("limit", [
    {"activeThreadPercentage": 0}, {"activeThreadPercentage": 101},
    {"activeThreadPercentage": "25"}, {"activeThreadPercentage": True},
    {"pinnedMemoryMiB": -1}, {"pinnedMemoryMiB": 2**60}, {"quota": 1}, "25", None,
])
def test_a_malformed_limit_never_reaches_the_daemon(limit: object) -> None:
    control = RecordingMpsControl()
    effect(control).reconcile({"x": record("x", "gpu-0", limit)}, corrupt=False)
    assert control.calls == []


def test_a_salvaged_record_is_not_bounded_and_bounds_nothing() -> None:
    """A record salvaged from a corrupt checkpoint keeps its GPU share taken, but its number
    is nobody's to trust: it reaches the daemon never, and no other share's ceiling holds
    that share below what it may have been given (MPS's own default, 100)."""
    control = RecordingMpsControl()
    salvaged = record("s", "gpu-1", {"activeThreadPercentage": 1}, recovered=True)
    effect(control).reconcile({"s": salvaged}, corrupt=True)
    assert control.calls == []
    effect(control).reconcile({"s": salvaged, "a": record("a", "gpu-0", {
        "activeThreadPercentage": 25})}, corrupt=True)
    assert control.calls == [("threads", 100)]


# -- nvidia-cuda-mps-control, as its manual says ------------------------------------------------


@dataclass
class Done:
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Daemon:
    """The control daemon's answers to one command line each (stdin), as a run() stand-in."""

    def __init__(self, servers: str = "4242\n", replies: dict[str, Done] | None = None) -> None:
        self.servers = servers
        self.replies = replies or {}
        self.lines: list[str] = []
        self.envs: list[str] = []
        self.timeouts: list[float] = []

    def __call__(self, args: list[str], **kw: Any) -> Done:
        assert args == ["/usr/bin/nvidia-cuda-mps-control"]
        line = kw["input"].rstrip("\n")
        assert "\n" not in line  # one command per run: one answer per command
        self.lines.append(line)
        self.envs.append(kw["env"]["CUDA_MPS_PIPE_DIRECTORY"])
        self.timeouts.append(kw["timeout"])
        if line in self.replies:
            return self.replies[line]
        if line == "get_server_list":
            return Done(0, self.servers)
        return Done(0, "25.0\n" if "thread" in line else "")


def mps(daemon: Daemon) -> NvidiaMpsControl:
    return NvidiaMpsControl(Path("/usr/bin/nvidia-cuda-mps-control"), PIPE,
                            run=daemon)  # type: ignore[arg-type]


def test_nvidia_mps_control_sets_the_default_and_every_running_server() -> None:
    daemon = Daemon(servers="4242\n4343\n")
    control = mps(daemon)
    control.set_active_thread_percentage(25)
    control.set_pinned_memory_limit(UUID0, 20480)
    assert daemon.lines == [
        "set_default_active_thread_percentage 25", "get_server_list",
        "set_active_thread_percentage 4242 25", "set_active_thread_percentage 4343 25",
        f"set_default_device_pinned_mem_limit {UUID0} 20480M", "get_server_list",
        f"set_device_pinned_mem_limit 4242 {UUID0} 20480M",
        f"set_device_pinned_mem_limit 4343 {UUID0} 20480M",
    ]
    assert set(daemon.envs) == {str(PIPE)} and all(t > 0 for t in daemon.timeouts)


def test_a_server_gone_between_list_and_set_is_no_error() -> None:
    daemon = Daemon(replies={"set_active_thread_percentage 4242 25": Done(0, "Invalid pid")})
    servers = iter(["4242\n", ""])  # listed, then gone

    def run(args: list[str], **kw: Any) -> Done:
        if kw["input"] == "get_server_list\n":
            daemon.lines.append("get_server_list")
            return Done(0, next(servers))
        return daemon(args, **kw)

    mps(run).set_active_thread_percentage(25)  # type: ignore[arg-type]


@pytest.mark.parametrize(("reply", "said"), [
    (Done(1, "", "Cannot find MPS control daemon process\n"),
     "nvidia-cuda-mps-control exit 1: Cannot find MPS control daemon process"),
    (Done(0, "Invalid\n  percentage\n"), "nvidia-cuda-mps-control said: Invalid percentage"),
])
def test_nvidia_mps_control_failures_are_one_line(reply: Done, said: str) -> None:
    daemon = Daemon(replies={"set_default_active_thread_percentage 25": reply})
    with pytest.raises(MpsControlError) as err:
        mps(daemon).set_active_thread_percentage(25)
    assert str(err.value) == said


def test_nvidia_mps_control_that_hangs_is_an_error() -> None:
    def run(args: list[str], **kw: Any) -> Done:
        raise subprocess.TimeoutExpired(args, kw["timeout"])

    with pytest.raises(MpsControlError, match="did not answer within"):
        mps(run).set_active_thread_percentage(25)  # type: ignore[arg-type]


def test_a_server_list_that_is_not_pids_is_an_error() -> None:
    with pytest.raises(MpsControlError, match="not a list of server PIDs"):
        mps(Daemon(servers="oops\n")).set_active_thread_percentage(25)
