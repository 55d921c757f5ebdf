"""A plugin served over real unix sockets, registered with the kubelet stand-in: the node the
tests of tests/prepare, tests/checkpoint, tests/claim and tests/plugin drive.

Helpers (``build_node``, ``make_claim``, ``gpu``, ...) are imported from here; the fixtures
``short_root`` and ``node`` are defined here once and re-exported by the conftest.py of each
of those folders, so that pytest finds them there.

Socket paths must stay under 108 bytes, so the kubelet dir lives in a short /tmp directory.
Claims come from ``ClaimBook``, a ClaimSource over plain dicts; the API-server path
(``APIClaimSource``) is tested separately against the fake API server.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.store import CheckpointStore
from agent.claim.model import ClaimNotFoundError, ClaimRef
from agent.common.failpoints import Failpoints
from agent.common.metrics import Metrics
from agent.daemon import wiring
from agent.daemon.wiring import plugin_server
from agent.plugin import PluginOptions, PluginServer
from agent.prepare import CDIClaimSpecs, ClaimBuilder, ClaimMetadata, DevicePreparer, EnvOnlyEdits
from agent.prepare.cdispecs import DeviceEdits
from agent.prepare.options import PrepareOptions
from cdi.spec import ContainerEdits, DeviceNode
from discovery.model import Device, DeviceType, HostInfo, Inventory
from tests.fakes.kubelet import ClaimRef as KubeletClaimRef
from tests.fakes.kubelet import KubeletStandIn

DRIVER = "dra-agent.io"
NODE = "node-a"


def gpu(i: int) -> Device:
    return Device(
        name=f"gpu-{i}", type=DeviceType.GPU, attributes={}, capacity={},
        host=HostInfo(pci_address=f"0000:{0x18 + i:02x}:00.0", minor=i,
                      dev_nodes=(f"/dev/nvidia{i}",)),
    )


def nic(i: int) -> Device:
    return Device(
        name=f"nic-{i}", type=DeviceType.NIC, attributes={}, capacity={},
        host=HostInfo(pci_address=f"0000:{0x30 + i:02x}:00.0", if_name=f"ens{i}"),
    )


class NodeEdits:
    """Hardware edits with explicit type/major/minor, so injection never stats the host."""

    def edits_for(
        self, device: Device, *, interface_name: str | None = None, move_netdev: bool = False
    ) -> ContainerEdits:
        if device.host.minor is None:
            return ContainerEdits()
        return ContainerEdits(device_nodes=(DeviceNode(
            path=f"/dev/nvidia{device.host.minor}", type="c", major=195,
            minor=device.host.minor, permissions="rw"),))


class ClaimBook:
    """An in-memory ClaimSource; ``claims`` is what the API server would return."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0

    def put(self, claim: dict[str, Any]) -> dict[str, Any]:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
        return claim

    def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        self.gets += 1
        claim = self.claims.get((ref.namespace, ref.name))
        if claim is None:
            raise ClaimNotFoundError(str(ref), "not found in the API server (deleted?)")
        return claim


def make_claim(
    name: str,
    devices: list[str] | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    driver: str = DRIVER,
    pool: str = NODE,
    results: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim dict, allocated to ``devices`` (request "req")."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {},
    }
    if allocated:
        res = list(results or [])
        res += [{"request": "req", "driver": driver, "pool": pool, "device": d}
                for d in devices or []]
        claim["status"]["allocation"] = {"devices": {"results": res, "config": config or []}}
    return claim


def ref(claim: Mapping[str, Any]) -> KubeletClaimRef:
    meta = claim["metadata"]
    return KubeletClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@dataclass
class Node:
    """One node: the plugin, the kubelet stand-in, the claims and the directories."""

    root: Path
    options: PluginOptions
    prepare_options: PrepareOptions
    book: ClaimBook
    inventory: list[Device]
    metrics: Metrics
    server: PluginServer
    kubelet: KubeletStandIn
    #: GPU-wide share settings (agent.prepare.gpucontrol); None as on a node without
    #: nvidia-smi.
    gpu_control: Any = None
    #: The MPS server's limits (agent.prepare.mpscontrol); None as on a node without
    #: nvidia-cuda-mps-control.
    mps_control: Any = None

    @property
    def cdi_dir(self) -> Path:
        return self.prepare_options.cdi_dir

    @property
    def checkpoint(self) -> Path:
        return self.options.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"

    def prepare(self, *claims: Mapping[str, Any]) -> Any:
        return self.kubelet.prepare(DRIVER, [ref(c) for c in claims])

    def unprepare(self, *claims: Mapping[str, Any]) -> Any:
        return self.kubelet.unprepare(DRIVER, [ref(c) for c in claims])

    def new_server(self, **changes: Any) -> PluginServer:
        """A plugin server of this node; ``changes`` to its PluginOptions or PrepareOptions."""
        self.options, self.prepare_options = split_options(self.options, self.prepare_options,
                                                           changes)
        return plugin_server(
            self.options, self.prepare_options, lambda: Inventory(devices=tuple(self.inventory)),
            NodeEdits(), self.book, metrics=self.metrics, gpu_control=self.gpu_control,
            mps_control=self.mps_control,
        )

    def restart(self, **changes: Any) -> None:
        """Stop the agent and start a new one (same dirs), as after a crash or upgrade."""
        # Counted before the new socket exists: a registration that lands before the count
        # would otherwise be waited for again, and never come.
        since = len(self.kubelet.registrations)
        self.server.stop(0)
        self.server = self.new_server(**changes)
        self.server.start()
        self.kubelet.wait_registered(DRIVER, timeout=30, since=since)


@pytest.fixture
def short_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def split_options(
    plugin: PluginOptions, prepare: PrepareOptions, changes: Mapping[str, Any]
) -> tuple[PluginOptions, PrepareOptions]:
    """``changes`` applied to whichever of the two option objects has each field."""
    names = {f.name for f in fields(PluginOptions)}
    unknown = set(changes) - names - {f.name for f in fields(PrepareOptions)}
    if unknown:
        raise TypeError(f"no such option: {sorted(unknown)}")
    return (replace(plugin, **{k: v for k, v in changes.items() if k in names}),
            replace(prepare, **{k: v for k, v in changes.items() if k not in names}))


def node_options(root: Path, **changes: Any) -> tuple[PluginOptions, PrepareOptions]:
    """The options of a test node under ``root`` (its boot ID file written)."""
    boot = root / "boot_id"
    boot.write_text("boot-1\n")
    kubelet_dir = root / "kubelet"
    plugin = PluginOptions(driver_name=DRIVER, kubelet_dir=kubelet_dir,
                           registration_timeout_s=10)
    prepare = PrepareOptions(driver_name=DRIVER, node_name=NODE,
                             plugin_dir=kubelet_dir / "plugins" / DRIVER, cdi_dir=root / "cdi",
                             boot_id_path=boot)
    return split_options(plugin, prepare, changes)


def build_node(root: Path, **option_changes: Any) -> Node:
    options, prepare = node_options(root, **option_changes)
    book = ClaimBook()
    inventory = [gpu(i) for i in range(8)] + [nic(0), nic(1)]
    metrics = Metrics()
    node = Node(root, options, prepare, book, inventory, metrics,
                None, None)  # type: ignore[arg-type]
    node.server = node.new_server()
    node.server.start()
    node.kubelet = KubeletStandIn(options.kubelet_dir / "plugins_registry").start()
    node.kubelet.wait_registered(DRIVER)
    return node


@pytest.fixture
def node(short_root: Path) -> Iterator[Node]:
    n = build_node(short_root)
    yield n
    n.kubelet.stop()
    n.server.stop(0)


def device_preparer(
    root: Path, inventory: Callable[[], Inventory], *, edits: DeviceEdits | None = None,
    boot_id: str = "boot-1", checkpoint: CheckpointStore | None = None,
    metadata: ClaimMetadata | None = None, failpoints: Failpoints | None = None,
    **effects: Any,
) -> DevicePreparer:
    """A preparer without a plugin around it: spec files under ``root/cdi``, the checkpoint
    at ``root/state/checkpoint.json``, the agent's own effects in the agent's own order
    (``agent.daemon.wiring.effects``; ``effects``: its gpu_control, mig, sriov, rescan,
    mps_pipe_dir, mps_control); no metadata files unless ``metadata``."""
    ordered = wiring.effects(inventory, metadata=metadata or ClaimMetadata(DRIVER, None, False),
                             failpoints=failpoints, **effects)
    builder = ClaimBuilder(driver=DRIVER, pool=NODE, node_name=NODE,
                           specs=CDIClaimSpecs(root / "cdi", DRIVER, edits or EnvOnlyEdits()),
                           boot_id=boot_id, effects=ordered)
    return DevicePreparer(
        builder=builder, inventory=inventory, failpoints=failpoints,
        checkpoint=checkpoint or CheckpointStore(root / "state" / "checkpoint.json"))
