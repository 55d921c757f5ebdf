"""The createRuntime hook as the runtime runs it: the installed bundle (``agent.netdev.install``)
started from its manifest with an empty environment, the OCI state on stdin, against a
namespace the test made (conftest). Its wall time is measured in ``python -m hack.bench``'s
terms in the report, not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.netdev.install import HookLaunch
from tests.netdev.conftest import Pod, run_hook

CONFIG = {"addresses": ["192.0.2.10/24"], "mtu": 4000,
          "routes": [{"default": True, "gateway": "192.0.2.1"}]}


def state(pod: Pod, bundle: str = "") -> dict[str, object]:
    return {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": pod.pid,
            "bundle": bundle}


def test_the_installed_hook_configures_the_pods_interface(launch: HookLaunch,
                                                          pod: Pod) -> None:
    done = run_hook(launch, state(pod), "--interface=net1",
                    f"--config={json.dumps(CONFIG)}", "--claim=uid-1")
    assert (done.returncode, done.stderr) == (0, "")
    [shown] = pod.ip("addr", "show", "net1")
    assert isinstance(shown, dict)
    assert shown["mtu"] == 4000
    assert [(a["local"], a["prefixlen"]) for a in shown["addr_info"]
            if a["family"] == "inet"] == [("192.0.2.10", 24)]
    assert [(r["dst"], r.get("gateway")) for r in pod.ip("route", "show", "default")] == [
        ("default", "192.0.2.1")]


def test_the_bundle_needs_nothing_of_the_hosts_python(launch: HookLaunch) -> None:
    """Started through its own loader and interpreter, isolated (-I: no environment, no user
    site): every path the runtime is given lies in the bundle."""
    dest = str(Path(launch.path).parents[0]).split("/root/")[0] + "/root/"
    libdirs, interpreter = launch.args[2].split(":"), launch.args[3]
    assert launch.args[0] == launch.path and launch.args[1] == "--library-path"
    assert all(p.startswith(dest) for p in (launch.path, interpreter, *libdirs))
    assert launch.args[4:] == ("-I", "-m", "agent.netdev.hook")
    assert Path(interpreter).is_file() and Path(launch.path).is_file()


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (("--interface=net1", "--config={}"), {"pid": 0}, "has no container pid (0)"),
    (("--interface=net1", '--config={"mtu": 10}'), None, "--config: mtu: 10 is not an MTU"),
    (("--interface=net1", "--config=[1"), None, "--config: Expecting"),
    (("--interface=net1", "--config={}", "--bogus=1"), None, "unknown argument '--bogus=1'"),
    (("--interface=net9", '--config={"mtu": 1500}'), None,
     "interface net9: No such device"),
    (("--interface=net1", '--config={"rdma": "exclusive"}'), None,
     "rdma: exclusive needs --rdma-device and --state"),
])
def test_bad_input_is_one_line_and_exit_1(launch: HookLaunch, pod: Pod, args: tuple[str, ...],
                                          stdin: object, message: str) -> None:
    done = run_hook(launch, stdin if stdin is not None else state(pod), *args, "--claim=u2")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dra-agent netdev hook (claim u2): ")
    assert message in lines[0]


def test_rdma_exclusive_records_the_namespace_before_the_move(launch: HookLaunch, pod: Pod,
                                                              tmp_path: Path) -> None:
    """The record the agent's give-back reads is written before the RDMA device moves; on a
    kernel without RDMA the move itself is the error (this machine has no ib_core)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"linux": {"namespaces": [
        {"type": "pid"}, {"type": "network", "path": pod.netns_path}]}}))
    record = tmp_path / "state" / "uid-3" / "nic-0.json"
    done = run_hook(launch, state(pod, str(bundle)), "--interface=net1",
                    '--config={"rdma": "exclusive"}', "--rdma-device=mlx5_0",
                    f"--state={record}", "--claim=uid-3")
    written = json.loads(record.read_text())
    assert written["rdmaDevice"] == "mlx5_0" and written["netns"] == pod.netns_path
    assert written["inode"] == Path(pod.netns_path).stat().st_ino
    if Path("/sys/class/infiniband").exists():
        pytest.skip("a kernel with RDMA: the error path below is for one without")
    assert done.returncode == 1
    assert "netlink protocol 20: Protocol not supported" in done.stderr
