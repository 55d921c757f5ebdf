"""End-to-end harness: the real ``dra-agent run`` as a process, the fake API server, the kubelet
stand-in, and ``explain`` playing the scheduler.

Everything a test asserts is read from the outside, as an operator would: the API server's
objects, the gRPC answers, the files in the CDI directory and the checkpoint on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import ClaimRef, KubeletStandIn, PrepareResult, Registration
from tests.ports import free_port
from tests.waiting import wait_for as poll

REPO = Path(__file__).resolve().parents[2]
DRIVER = "dra-agent.io"
NODE = "node-e2e"
CDI_VENDOR = f"k8s.{DRIVER}"
SPEC_PREFIX = f"{CDI_VENDOR}-claim_"
#: Device metadata files (``agent.prepare.metadata.HOST_SUBDIR``) in the plugin dir.
METADATA_DIR = "dra-device-metadata"
GPU_CLASS = f"gpu.{DRIVER}"
NIC_CLASS = f"nic.{DRIVER}"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 10.0,
             interval: float = 0.02) -> Any:
    """``tests.waiting.wait_for`` with the condition's name first, as the e2e tests read."""
    return poll(check, timeout=timeout, what=what, interval=interval)


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses we ship (deploy/base), used as the scheduler's classes."""
    with (REPO / "deploy" / "base" / "deviceclasses.yaml").open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


# --- directories of one node -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeDirs:
    """The node's directories. The root must be short: unix socket paths stay under 108 bytes."""

    root: Path
    #: Where this test sees the agent's filesystem, when the agent runs in its own mount
    #: namespace (``/proc/<pid>/root``); None when both see the same.
    view: Path | None = None

    def seen(self, path: Path) -> Path:
        """``path`` as the agent sees it, reachable from the test."""
        return self.view / path.relative_to("/") if self.view is not None else path

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def boot_id(self) -> Path:
        return self.root / "boot_id"

    @property
    def registry(self) -> Path:
        return self.kubelet / "plugins_registry"

    @property
    def plugin(self) -> Path:
        return self.kubelet / "plugins" / DRIVER

    @property
    def checkpoint(self) -> Path:
        return self.plugin / "checkpoint.json"

    def spec_path(self, uid: str) -> Path:
        return self.cdi / f"{SPEC_PREFIX}{uid}.json"

    def cdi_files(self) -> list[str]:
        """Every name in the CDI dir, temp files included (a half-written file shows here)."""
        cdi = self.seen(self.cdi)
        return sorted(os.listdir(cdi)) if cdi.is_dir() else []

    def checkpoint_doc(self) -> dict[str, Any]:
        """The checkpoint as JSON ({} when absent), its checksum verified by the agent's decoder."""
        if not self.checkpoint.exists():
            return {}
        from agent.checkpoint.codec import decode

        raw = self.checkpoint.read_bytes()
        decode(raw, str(self.checkpoint))  # raises when the file is not trustworthy
        doc: dict[str, Any] = json.loads(raw)
        return doc

    def records(self) -> dict[str, dict[str, Any]]:
        claims: dict[str, dict[str, Any]] = self.checkpoint_doc().get("claims", {})
        return claims

    def plugin_leftovers(self) -> list[str]:
        """Files in the plugin dir that are neither the checkpoint, its locks, sockets, nor
        device metadata files (under ``dra-device-metadata``, whose own strays count)."""
        if not self.plugin.is_dir():
            return []
        keep = ("checkpoint.json", ".lock", ".sock", ".corrupt-")
        out = [n for n in os.listdir(self.plugin)
               if n != METADATA_DIR and not any(k in n for k in keep)]
        metadata = self.plugin / METADATA_DIR
        if metadata.is_dir():
            out += [str(p.relative_to(self.plugin)) for p in metadata.rglob("*")
                    if not p.is_dir() and p.name != "metadata.json"]
        return sorted(out)

    def metadata_files(self) -> list[str]:
        """``<namespace>_<claim>/<request>`` of each device metadata file."""
        metadata = self.plugin / METADATA_DIR
        return sorted(str(p.parent.relative_to(metadata))
                      for p in metadata.rglob("metadata.json")) if metadata.is_dir() else []

    def set_boot_id(self, boot_id: str) -> None:
        self.boot_id.write_text(boot_id + "\n")


@contextlib.contextmanager
def temporary_node_dirs(prefix: str) -> Iterator[NodeDirs]:
    """A node's directories under a fresh, short root in /tmp (unix socket paths must stay
    under 108 bytes), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield NodeDirs(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- the agent process -----------------------------------------------------------------------


class AgentProcess:
    """``dra-agent run --simulate dgx-h100`` as a child process, logs in a file.

    ``wrap`` is a command prefix the agent runs under (``unshare ... sh -c '...; exec "$@"'``);
    it must exec the agent, so that ``pid`` is the agent's.
    """

    def __init__(
        self,
        dirs: NodeDirs,
        kubeconfig: str,
        *extra: str,
        env: Mapping[str, str] | None = None,
        profile: str = "dgx-h100",
        name: str = "agent",
        wrap: Sequence[str] = (),
        node: str = NODE,
    ) -> None:
        self.dirs = dirs
        self.port = free_port()
        self.log = dirs.root / f"{name}-{self.port}.log"
        if not dirs.boot_id.exists():
            dirs.set_boot_id("boot-1")
        self.args = [
            *wrap, sys.executable, "-m", "agent.cli", "run", "--simulate", profile,
            "--node-name", node, "--kubeconfig", kubeconfig,
            "--kubelet-dir", str(dirs.kubelet), "--cdi-dir", str(dirs.cdi),
            "--metrics-address", f"127.0.0.1:{self.port}",
            "--boot-id-file", str(dirs.boot_id), "--shutdown-grace", "2", *extra,
        ]
        # A clean environment: no systemd socket, no agent settings leaking from the caller.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("DRA_AGENT_") and k != "NOTIFY_SOCKET"}
        self.env.update(env or {})
        self.started = time.monotonic()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=out,
                                         stderr=subprocess.STDOUT, env=self.env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def url(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode()

    def wait_http(self, path: str = "/readyz", timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"agent exited ({self.proc.returncode}):\n{self.logs()}")
            try:
                last = self.url(path)
                if last[0] == 200:
                    return str(last[1])
            except OSError as err:
                last = err
            time.sleep(0.05)
        raise AssertionError(f"{path} never answered 200 (last {last}):\n{self.logs()}")

    def wait_exit(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"agent ignored SIGTERM for {timeout} s:\n{self.logs()}") from None

    def rss_kib(self) -> int:
        """VmRSS of the process, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError(f"no VmRSS for pid {self.pid}")


def reap(started: Sequence[AgentProcess], tail: int = 8000) -> None:
    """Kill the agents a test started and print what each said (pytest shows it when the
    test failed)."""
    for agent in started:
        if agent.alive():
            agent.kill()
        print(f"--- {agent.log.name} (exit {agent.proc.returncode}) ---\n{agent.logs()[-tail:]}")


def wait_registered(kubelet: KubeletStandIn, since: int = 0,
                    timeout: float = 20.0) -> Registration:
    """Wait for a registration of the driver (at index >= ``since``) that stays put.

    The stand-in identifies a socket by inode and ctime, and the agent chmods its registration
    socket just after it starts serving; a scan between the two registers the plugin, and the
    next one sees a "new" socket and registers it again (a real kubelet reacts to create and
    remove events only). Waiting until later scans agree keeps tests off that window.
    """
    while True:
        reg = kubelet.wait_registered(DRIVER, timeout=timeout, since=since)
        time.sleep(kubelet.poll_interval * 4)
        if kubelet.registered(DRIVER) is reg:
            return reg
        since = kubelet.registrations.index(reg) + 1


# --- the cluster: API server plus the scheduler's part ----------------------------------------


class Cluster:
    """The API server with our Node and DeviceClasses, and ``explain`` as the scheduler."""

    def __init__(self, server: FakeAPIServer, workdir: Path) -> None:
        self.server = server
        self.classes = device_classes()
        self.kubeconfig = str(server.write_kubeconfig(workdir / "kubeconfig"))
        self.seed()

    def seed(self) -> None:
        """The objects a cluster has before any claim: the Node and the DeviceClasses."""
        self.server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        for cls in self.classes:
            self.server.put_object(cls)

    def node_slices(self) -> list[dict[str, Any]]:
        return [s for s in self.server.list_objects("resourceslices")
                if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == DRIVER]

    def published_devices(self) -> list[str]:
        return sorted(d["name"] for s in self.node_slices() for d in s["spec"]["devices"])

    def wait_published(self, timeout: float = 20.0) -> list[dict[str, Any]]:
        slices: list[dict[str, Any]] = wait_for("ResourceSlices", self.node_slices, timeout)
        return slices

    def create_claim(
        self,
        name: str,
        requests: Sequence[tuple[str, str]] = (("gpu", GPU_CLASS),),
        *,
        match_attribute: str | None = None,
        namespace: str = "default",
        config: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """A v1 ResourceClaim asking for one device of each (request name, class)."""
        spec: dict[str, Any] = {"devices": {"requests": [
            {"name": req, "exactly": {"deviceClassName": cls}} for req, cls in requests]}}
        if match_attribute:
            spec["devices"]["constraints"] = [
                {"requests": [r for r, _ in requests], "matchAttribute": match_attribute}]
        if config:
            spec["devices"]["config"] = [dict(c) for c in config]
        return self.server.put_object({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec,
        })

    def allocate(self, claim: Mapping[str, Any], pods: int = 1) -> dict[str, Any]:
        """Filter with ``explain`` against the published slices and the other allocated claims,
        then write the allocation and ``reservedFor`` as the scheduler's PreBind does."""
        from agent.explain import explain

        meta = claim["metadata"]
        others = [c for c in self.server.list_objects("resourceclaims")
                  if (c.get("status") or {}).get("allocation")
                  and c["metadata"]["uid"] != meta["uid"]]
        slices = self.wait_published()  # the scheduler only sees what was published
        result = explain(dict(claim), self.classes, slices, NODE, allocated=others)
        assert result.fits and result.allocation, f"claim does not fit: {result.to_dict()}"
        current = self.server.get_object("resourceclaims", meta["name"], meta["namespace"])
        assert current is not None
        current["status"] = {
            "allocation": result.allocation,
            "reservedFor": [{"resource": "pods", "name": f"{meta['name']}-pod-{i}",
                             "uid": str(uuid.uuid4())} for i in range(pods)],
        }
        return self.server.put_object(current)


def ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def allocated_devices(claim: Mapping[str, Any]) -> dict[str, str]:
    """device name -> request name, from the claim's allocation."""
    results = claim["status"]["allocation"]["devices"]["results"]
    return {r["device"]: r["request"] for r in results if r["driver"] == DRIVER}


# --- end-state assertions ----------------------------------------------------------------------


def expected_cdi_id(uid: str, device: str) -> str:
    return f"{CDI_VENDOR}/claim={uid}-{device}"


def assert_answer(claim: Mapping[str, Any], result: PrepareResult) -> None:
    """The prepare answer names exactly the allocated devices, each with its CDI ID."""
    uid = claim["metadata"]["uid"]
    assert result.ok, f"prepare of {uid} failed: {result.error}"
    want = allocated_devices(claim)
    got = {d.device_name: d for d in result.devices}
    assert sorted(got) == sorted(want)
    for name, device in got.items():
        assert device.pool_name == NODE
        assert device.request_names == (want[name],)
        assert device.cdi_device_ids == (expected_cdi_id(uid, name),)


def assert_prepared(dirs: NodeDirs, *claims: Mapping[str, Any]) -> None:
    """Exactly these claims are prepared: one spec file each, nothing else in the CDI dir, and
    one PrepareCompleted record each in a checkpoint whose checksum holds."""
    uids = sorted(c["metadata"]["uid"] for c in claims)
    assert dirs.cdi_files() == sorted(dirs.spec_path(u).name for u in uids)
    records = dirs.records()
    assert sorted(records) == uids
    for claim in claims:
        meta = claim["metadata"]
        uid = meta["uid"]
        want = allocated_devices(claim)
        spec = json.loads(dirs.seen(dirs.spec_path(uid)).read_text())
        assert spec["kind"] == f"{CDI_VENDOR}/claim"
        assert sorted(d["name"] for d in spec["devices"]) == sorted(f"{uid}-{d}" for d in want)
        rec = records[uid]
        assert rec["state"] == "PrepareCompleted", rec
        assert (rec["namespace"], rec["name"]) == (meta["namespace"], meta["name"])
        assert rec["specPath"] == str(dirs.spec_path(uid))
        assert rec["bootID"] == dirs.boot_id.read_text().strip()
        assert not rec.get("recovered"), rec
        assert sorted((d["device"], tuple(d["requests"]), tuple(d["cdiDeviceIDs"]))
                      for d in rec["devices"]) == sorted(
            (d, (r,), (expected_cdi_id(uid, d),)) for d, r in want.items())
    # One device metadata file per request of ours (the agent's default --device-metadata).
    assert dirs.metadata_files() == sorted({
        f"{c['metadata']['namespace']}_{c['metadata']['name']}/{r['request'].split('/')[0]}"
        for c in claims for r in c["status"]["allocation"]["devices"]["results"]
        if r["driver"] == DRIVER})
    assert dirs.plugin_leftovers() == []


def assert_nothing_left(dirs: NodeDirs) -> None:
    """No spec file, no temp file, no checkpoint record, no device metadata file."""
    assert dirs.cdi_files() == []
    assert dirs.records() == {}
    assert dirs.metadata_files() == []
    assert dirs.plugin_leftovers() == []


def claims_command(dirs: NodeDirs) -> list[dict[str, Any]]:
    """``dra-agent claims -o json`` for this node: what an operator sees."""
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "claims", "-o", "json",
         "--kubelet-dir", str(dirs.kubelet), "--driver-name", DRIVER],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
    )
    assert out.returncode == 0, out.stderr
    data: list[dict[str, Any]] = json.loads(out.stdout)
    return data
