"""Device metadata for workloads (KEP-5304): the file of each request, its CDI mount, its
record, and its life through unprepare, restarts, reboots and ``--no-device-metadata``.

The expected documents are written out by hand from the 1.37 sources
(``k8s.io/dynamic-resource-allocation`` v0.37.2, ``api/metadata/v1beta1`` and
``kubeletplugin/metadata.go``); ``hack/metadata-check.sh`` then has the upstream library
itself decode each file and re-encode it to the same bytes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.codec import decode, encode
from agent.checkpoint.model import ClaimState
from agent.claim.model import POD_CLAIM_NAME_ANNOTATION
from discovery.model import PCI_BUS_ID, Version
from tests.plugnode import DRIVER, Node, gpu, make_claim, nic

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_DIR = "/var/run/kubernetes.io/dra-device-attributes"


def rich_gpu(i: int) -> Any:
    return replace(gpu(i), attributes={
        PCI_BUS_ID: f"0000:{0x18 + i:02x}:00.0", "productName": "NVIDIA H100 80GB HBM3",
        "driverVersion": Version("550.54.15"), "index": i,
    })


def rich_nic(i: int) -> Any:
    return replace(nic(i), attributes={
        PCI_BUS_ID: f"0000:{0x30 + i:02x}:00.0", "macAddress": f"0c:42:a1:00:00:0{i}",
        "isVF": False,
    })


@pytest.fixture
def rich(node: Node) -> Node:
    """The node with devices that carry attributes, as discovery publishes them."""
    node.inventory[:] = [rich_gpu(i) for i in range(4)] + [rich_nic(0), rich_nic(1)]
    return node


def meta_root(node: Node) -> Path:
    return node.options.kubelet_dir / "plugins" / DRIVER / "dra-device-metadata"


def meta_file(node: Node, claim: str, request: str = "req", namespace: str = "default") -> Path:
    return meta_root(node) / f"{namespace}_{claim}" / request / "metadata.json"


def spec_of(node: Node, uid: str) -> dict[str, Any]:
    return json.loads((node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").read_text())


def mounts_by_device(node: Node, uid: str) -> dict[str, list[dict[str, Any]]]:
    return {d["name"].removeprefix(f"{uid}-"): d["containerEdits"].get("mounts", [])
            for d in spec_of(node, uid)["devices"]}


def uid_of(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


GPU_FILE = """\
{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "train",
    "namespace": "default",
    "uid": "0b7e1c2a-5d4f-4c3b-9a8e-1f2d3c4b5a69",
    "generation": 1
  },
  "requests": [
    {
      "name": "req",
      "devices": [
        {
          "driver": "dra-agent.io",
          "pool": "node-a",
          "name": "gpu-1",
          "attributes": {
            "driverVersion": {
              "version": "550.54.15"
            },
            "index": {
              "int": 1
            },
            "productName": {
              "string": "NVIDIA H100 80GB HBM3"
            },
            "resource.kubernetes.io/pciBusID": {
              "string": "0000:19:00.0"
            },
            "type": {
              "string": "gpu"
            }
          }
        }
      ]
    }
  ]
}
"""


def test_gpu_claim_gets_the_exact_upstream_file_and_a_read_only_bind_mount(rich: Node) -> None:
    claim = rich.book.put(make_claim("train", ["gpu-1"],
                                     uid="0b7e1c2a-5d4f-4c3b-9a8e-1f2d3c4b5a69"))
    assert rich.prepare(claim)[uid_of(claim)].ok
    path = meta_file(rich, "train")
    assert path.read_text() == GPU_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # a non-root container user reads it
    for d in (path.parent, path.parent.parent, meta_root(rich)):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755
    assert mounts_by_device(rich, uid_of(claim)) == {"gpu-1": [{
        "hostPath": str(path),
        "containerPath": f"{UPSTREAM_DIR}/resourceclaims/train/req/dra-agent.io-metadata.json",
        "options": ["ro", "bind"],
    }]}
    # The attributes are the slice's, byte for byte.
    doc = json.loads(path.read_text())
    assert doc["requests"][0]["devices"][0]["attributes"] == rich_gpu(1).to_api()["attributes"]


def test_under_the_agents_umask_077_the_file_is_still_world_readable(rich: Node) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0"]))
    before = os.umask(0o077)  # what `dra-agent run` sets for everything else it creates
    try:
        assert rich.prepare(claim)[uid_of(claim)].ok
    finally:
        os.umask(before)
    path = meta_file(rich, "c1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [stat.S_IMODE(d.stat().st_mode) for d in (path.parent, path.parent.parent,
                                                     meta_root(rich))] == [0o755] * 3


def test_nic_claim_file_has_the_network_data_of_its_claim_status(rich: Node) -> None:
    moved = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
        "netdev": {"move": True, "interfaceName": "net1"}}}}]
    claim = rich.book.put(make_claim("net", ["nic-1"], config=moved))
    assert rich.prepare(claim)[uid_of(claim)].ok
    (device,) = json.loads(meta_file(rich, "net").read_text())["requests"][0]["devices"]
    # The interface name inside the pod (it moved there) and the MAC, as status.devices says.
    assert device == {
        "driver": DRIVER, "pool": "node-a", "name": "nic-1",
        "attributes": {
            "isVF": {"bool": False}, "macAddress": {"string": "0c:42:a1:00:00:01"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:31:00.0"},
            "type": {"string": "nic"},
        },
        "networkData": {"interfaceName": "net1", "hardwareAddress": "0c:42:a1:00:00:01"},
    }
    from agent.claim.parse import parse_claim

    nics = rich.server.preparer.network_status(parse_claim(claim))
    assert [(n.interface_name, n.hardware_address) for n in nics] == [
        (device["networkData"]["interfaceName"], device["networkData"]["hardwareAddress"])]


def test_template_claim_is_mounted_under_its_pod_claim_name(rich: Node) -> None:
    claim = make_claim("pod-1-gpu-x7k2p", ["gpu-0"])
    claim["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    rich.book.put(claim)
    assert rich.prepare(claim)[uid_of(claim)].ok
    path = meta_file(rich, "pod-1-gpu-x7k2p")  # the host side keeps the claim's own name
    doc = json.loads(path.read_text())
    assert doc["podClaimName"] == "gpu" and doc["metadata"]["name"] == "pod-1-gpu-x7k2p"
    assert list(doc) == ["kind", "apiVersion", "metadata", "podClaimName", "requests"]
    (mount,) = mounts_by_device(rich, uid_of(claim))["gpu-0"]
    assert mount["containerPath"] == (
        f"{UPSTREAM_DIR}/resourceclaimtemplates/gpu/req/dra-agent.io-metadata.json")
    record = decode(rich.checkpoint.read_bytes()).claims[uid_of(claim)]
    assert record.metadata is not None and record.metadata.pod_claim_name == "gpu"


def test_each_request_gets_its_file_and_the_mount_sits_on_its_first_device(rich: Node) -> None:
    claim = rich.book.put(make_claim("multi", [], results=[
        {"request": "gpus", "driver": DRIVER, "pool": "node-a", "device": "gpu-2"},
        {"request": "gpus", "driver": DRIVER, "pool": "node-a", "device": "gpu-3"},
        {"request": "net/fast", "driver": DRIVER, "pool": "node-a", "device": "nic-0"},
        {"request": "other", "driver": "other.example.com", "pool": "x", "device": "y"},
    ]))
    uid = uid_of(claim)
    assert rich.prepare(claim)[uid].ok
    gpus = json.loads(meta_file(rich, "multi", "gpus").read_text())
    assert [r["name"] for r in gpus["requests"]] == ["gpus"]
    assert [d["name"] for d in gpus["requests"][0]["devices"]] == ["gpu-2", "gpu-3"]
    # A subrequest: the document names it, the path uses the request containers reference.
    net = json.loads(meta_file(rich, "multi", "net").read_text())
    assert net["requests"][0]["name"] == "net/fast"
    assert sorted(p.name for p in (meta_root(rich) / "default_multi").iterdir()) == [
        "gpus", "net"]  # nothing for the other driver's request
    mounts = mounts_by_device(rich, uid)
    assert [m["containerPath"].split("/")[-2] for m in mounts["gpu-2"]] == ["gpus"]
    assert mounts["gpu-3"] == []
    assert [m["containerPath"].split("/")[-2] for m in mounts["nic-0"]] == ["net"]
    record = decode(rich.checkpoint.read_bytes()).claims[uid]
    assert record.to_json()["deviceMetadata"] == {"requests": ["gpus", "net"]}


def test_unprepare_removes_the_files_and_a_second_unprepare_succeeds(rich: Node) -> None:
    keep = rich.book.put(make_claim("keep", ["gpu-0"]))
    claim = rich.book.put(make_claim("gone", ["gpu-1"]))
    assert all(r.ok for r in rich.prepare(keep, claim).values())
    assert meta_file(rich, "gone").exists()
    assert rich.unprepare(claim)[uid_of(claim)].ok
    assert not (meta_root(rich) / "default_gone").exists()
    assert rich.unprepare(claim)[uid_of(claim)].ok
    assert meta_file(rich, "keep").read_text()  # the other claim's file is untouched
    assert rich.prepare(claim)[uid_of(claim)].ok  # and the claim can come back


def test_a_reboot_rebuilds_a_lost_file_with_the_spec_from_the_checkpoint(rich: Node) -> None:
    claim = make_claim("train", ["gpu-1"])
    claim["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    rich.book.put(claim)
    uid = uid_of(claim)
    assert rich.prepare(claim)[uid].ok
    before = meta_file(rich, "train").read_bytes()
    mounts = mounts_by_device(rich, uid)
    rich.server.stop(0)  # killed; then the node reboots: tmpfs gone, the file lost too
    for f in rich.cdi_dir.iterdir():
        f.unlink()
    meta_file(rich, "train").unlink()
    (rich.root / "boot_id").write_text("boot-2\n")
    rich.book.claims.clear()  # no API server: the checkpoint alone must do
    rich.server = rich.new_server()
    rich.server.start()  # recovery runs before the kubelet can register
    assert meta_file(rich, "train").read_bytes() == before
    assert mounts_by_device(rich, uid) == mounts
    record = decode(rich.checkpoint.read_bytes()).claims[uid]
    assert record.boot_id == "boot-2" and record.metadata is not None


def test_a_file_lost_without_a_reboot_is_rewritten_by_the_next_start(rich: Node) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0"]))
    assert rich.prepare(claim)[uid_of(claim)].ok
    before = meta_file(rich, "c1").read_bytes()
    rich.server.stop(0)
    meta_file(rich, "c1").unlink()
    rich.restart()
    assert meta_file(rich, "c1").read_bytes() == before


def test_no_device_metadata_writes_nothing_and_mounts_nothing(short_root: Path) -> None:
    from tests.plugnode import build_node

    node = build_node(short_root, device_metadata=False)
    try:
        claim = node.book.put(make_claim("c1", ["gpu-0"], results=[
            {"request": "net", "driver": DRIVER, "pool": "node-a", "device": "nic-0"}]))
        assert node.prepare(claim)[uid_of(claim)].ok
        assert not meta_root(node).exists()
        assert all(m == [] for m in mounts_by_device(node, uid_of(claim)).values())
        assert "deviceMetadata" not in decode(node.checkpoint.read_bytes()).claims[
            uid_of(claim)].to_json()
    finally:
        node.kubelet.stop()
        node.server.stop(0)


def test_switched_off_later_the_files_go_with_unprepare(rich: Node) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0"]))
    assert rich.prepare(claim)[uid_of(claim)].ok
    rich.restart(device_metadata=False)
    assert rich.unprepare(claim)[uid_of(claim)].ok
    assert not (meta_root(rich) / "default_c1").exists()


def test_old_checkpoint_without_the_field_loads_and_stays_without_files(rich: Node) -> None:
    claim = rich.book.put(make_claim("old", ["gpu-0"]))
    uid = uid_of(claim)
    assert rich.prepare(claim)[uid].ok
    rich.server.stop(0)
    # As the previous version wrote it: no deviceMetadata key (and no file).
    data = decode(rich.checkpoint.read_bytes())
    rich.checkpoint.write_bytes(encode(data.with_claims(
        {uid: replace(data.claims[uid], metadata=None)})))
    assert b"deviceMetadata" not in rich.checkpoint.read_bytes()
    meta_file(rich, "old").unlink()
    (rich.root / "boot_id").write_text("boot-2\n")
    rich.restart()
    record = decode(rich.checkpoint.read_bytes()).claims[uid]
    assert record.state is ClaimState.PREPARE_COMPLETED and record.metadata is None
    # Rebuilt as it was prepared: the running pod never had the mount, its restart neither.
    assert mounts_by_device(rich, uid) == {"gpu-0": []}
    assert not meta_file(rich, "old").exists()
    assert rich.unprepare(claim)[uid].ok


def test_after_a_corrupt_checkpoint_unprepare_still_removes_the_files(rich: Node) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0"]))
    uid = uid_of(claim)
    assert rich.prepare(claim)[uid].ok
    rich.server.stop(0)
    rich.checkpoint.write_bytes(b'{"claims": {"trunc')  # nothing salvaged
    rich.restart()
    # Start-up kept the file (the evidence, like the spec it adopted) ...
    record = decode(rich.checkpoint.read_bytes()).claims[uid]
    assert record.recovered and record.metadata is None and meta_file(rich, "c1").exists()
    # ... and the kubelet's unprepare, which names the claim, removes it.
    assert rich.unprepare(claim)[uid].ok
    assert not (meta_root(rich) / "default_c1").exists()


def test_interrupted_prepare_and_orphans_are_cleaned_at_start(rich: Node) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0"]))
    uid = uid_of(claim)
    assert rich.prepare(claim)[uid].ok
    rich.server.stop(0)
    data = decode(rich.checkpoint.read_bytes())
    started = replace(data.claims[uid], state=ClaimState.PREPARE_STARTED)
    rich.checkpoint.write_bytes(encode(data.with_claims({uid: started})))
    # A crash before the first durable record: files no record lists at all.
    ghost = meta_file(rich, "ghost")
    ghost.parent.mkdir(parents=True)
    ghost.write_text("{}")
    (ghost.parent / ".metadata.json.0123abcd.tmp").write_text("half")
    not_ours = meta_root(rich) / "lost+found"
    not_ours.mkdir()
    rich.restart()
    assert not (meta_root(rich) / "default_c1").exists()
    assert not (meta_root(rich) / "default_ghost").exists()
    assert not_ours.exists()  # a name no claim can have is left alone
    assert rich.prepare(claim)[uid].ok and meta_file(rich, "c1").exists()


def test_spec_with_the_mount_passes_the_reference_library_and_injects_it(
    rich: Node, cdi_check_bin: Path
) -> None:
    claim = rich.book.put(make_claim("c1", ["gpu-0", "gpu-1"]))
    out = rich.prepare(claim)[uid_of(claim)]
    assert out.ok
    run = [str(cdi_check_bin), "validate", str(rich.cdi_dir)]
    assert subprocess.run(run, capture_output=True, check=False, timeout=60).returncode == 0
    ids = [i for d in out.devices for i in d.cdi_device_ids]
    injected = subprocess.run([str(cdi_check_bin), "inject", str(rich.cdi_dir), *ids],
                              capture_output=True, text=True, check=False, timeout=60)
    assert injected.returncode == 0, injected.stderr
    mounts = json.loads(injected.stdout)["mounts"]
    assert [(m["source"], m["destination"], m["options"]) for m in mounts] == [(
        str(meta_file(rich, "c1")),
        f"{UPSTREAM_DIR}/resourceclaims/c1/req/dra-agent.io-metadata.json", ["ro", "bind"])]


@pytest.fixture(scope="session")
def metadata_check_bin() -> Path:
    """The upstream library's reader (``hack/metadata-check.sh``), built once per machine like
    the CDI checker: a machine that cannot build it fails here, never skips."""
    out = subprocess.run([str(REPO / "hack" / "metadata-check.sh"), "setup"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, f"metadata-check setup failed:\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])


def test_upstream_library_reads_every_file_and_would_write_the_same_bytes(
    rich: Node, metadata_check_bin: Path
) -> None:
    plain = rich.book.put(make_claim("plain", ["gpu-0"], results=[
        {"request": "net/fast", "driver": DRIVER, "pool": "node-a", "device": "nic-0"}]))
    template = make_claim("tmpl-abc12", ["gpu-1", "gpu-2"])
    template["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    rich.book.put(template)
    assert all(r.ok for r in rich.prepare(plain, template).values())
    files = sorted(str(p) for p in meta_root(rich).rglob("metadata.json"))
    assert len(files) == 3
    out = subprocess.run([str(metadata_check_bin), *files], capture_output=True, text=True,
                         check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    decoded = [json.loads(line) for line in out.stdout.splitlines()]
    assert {d["requests"][0]["name"] for d in decoded} == {"req", "net/fast"}
    pci = [dev["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
           for d in decoded for dev in d["requests"][0]["devices"]]
    assert sorted(pci) == ["0000:18:00.0", "0000:19:00.0", "0000:1a:00.0", "0000:30:00.0"]


# -- the switch: flag > DRA_AGENT_DEVICE_METADATA > config file > default --------------------


class NoSockets:
    """What ``agent.daemon.early.serve`` returns, for a command whose daemon is a stand-in."""

    def stop(self, _grace_s: float) -> None:
        pass


@pytest.fixture
def run_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    """``dra-agent run`` up to the daemon, which records its options instead of running."""
    import logging
    import signal

    import agent.daemon
    import agent.daemon.early

    seen: list[Any] = []

    class FakeDaemon:
        def __init__(self, _cfg: Any, options: Any, **_parts: Any) -> None:  # sockets=
            seen.append(options)
            import threading

            self.stop_event = threading.Event()

        def run(self) -> int:
            return 0

    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    monkeypatch.setattr(agent.daemon, "Daemon", FakeDaemon)
    # Nor the kubelet's sockets, which the command serves before the daemon.
    monkeypatch.setattr(agent.daemon.early, "serve", lambda *_args: NoSockets())
    yield seen
    os.umask(umask)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    root.handlers[:], root.level = saved


@pytest.mark.parametrize(("args", "env", "file", "expected"), [
    ([], {}, None, True),
    (["--no-device-metadata"], {}, None, False),
    ([], {"DRA_AGENT_DEVICE_METADATA": "false"}, None, False),
    ([], {}, "device-metadata: false\n", False),
    ([], {"DRA_AGENT_DEVICE_METADATA": "true"}, "device-metadata: false\n", True),
    (["--device-metadata"], {"DRA_AGENT_DEVICE_METADATA": "0"}, None, True),
])
def test_switch_precedence(run_options: list[Any], tmp_path: Path, args: list[str],
                           env: dict[str, str], file: str | None, expected: bool) -> None:
    import click.testing

    from agent.commands.run import command

    if file is not None:
        (tmp_path / "agent.yaml").write_text(file)
        args = [*args, "--config", str(tmp_path / "agent.yaml")]
    result = click.testing.CliRunner().invoke(
        command, ["--node-name", "node-a", "--kubelet-dir", str(tmp_path), "--no-health", *args],
        env=env)
    assert result.exit_code == 0, result.output
    assert run_options[-1].device_metadata is expected


def test_config_example_and_check_know_the_key(tmp_path: Path) -> None:
    import click.testing

    from agent.commands.config import command as group

    example = click.testing.CliRunner().invoke(group, ["example"])
    assert "#device-metadata: true" in example.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("device-metadata: maybe\n")
    checked = click.testing.CliRunner().invoke(group, ["check", str(bad)])
    assert checked.exit_code == 2 and "device-metadata" in checked.output
    assert "Traceback" not in checked.output


# -- a real kill -9 between the files and the durable record ---------------------------------

CHILD = """
import json, os, sys
from pathlib import Path
from agent.checkpoint.store import CheckpointStore
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.metadatafiles import HostMetadataFiles
from discovery.model import Inventory
from tests.plugnode import DRIVER, device_preparer, gpu

root = Path(sys.argv[1])
preparer = device_preparer(
    root, lambda: Inventory(devices=(gpu(0),)),
    checkpoint=CheckpointStore(root / "checkpoint.json"),
    failpoints=Failpoints.from_env(os.environ),
    metadata=ClaimMetadata(DRIVER, HostMetadataFiles(root / "dra-device-metadata"), True),
)
preparer.prepare(parse_claim(json.loads((root / "claim.json").read_text())))
print("survived")
"""


def test_kill_9_after_the_files_leaves_nothing_once_restarted(tmp_path: Path) -> None:
    import signal
    import sys

    from agent.checkpoint.store import CheckpointStore
    from agent.claim.parse import parse_claim
    from agent.common.failpoints import ENV
    from agent.prepare import DevicePreparer
    from agent.prepare.claimmetadata import ClaimMetadata
    from agent.prepare.metadatafiles import HostMetadataFiles
    from discovery.model import Inventory
    from tests.plugnode import device_preparer

    claim = make_claim("c1", ["gpu-0"])
    (tmp_path / "claim.json").write_text(json.dumps(claim))
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV: "prepare-after-spec-written=kill"}
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    path = tmp_path / "dra-device-metadata" / "default_c1" / "req" / "metadata.json"
    assert path.is_file()  # written, and the spec; PrepareStarted was never made durable

    def preparer() -> DevicePreparer:
        return device_preparer(
            tmp_path, lambda: Inventory(devices=(gpu(0),)),
            checkpoint=CheckpointStore(tmp_path / "checkpoint.json"),
            metadata=ClaimMetadata(DRIVER, HostMetadataFiles(path.parents[2]), True),
        )

    restarted = preparer()
    report = restarted.recover()
    assert report.metadata_removed == ("default_c1/req",)
    assert not path.parent.parent.exists()
    record = restarted.prepare(parse_claim(claim))  # the kubelet's retry
    assert record.completed and path.is_file()
