"""An in-process agent plugin on simulated dgx-h100 hardware, served over real unix sockets,
with claims coming from whatever the fuzzer hands it.

The plugin runs in-process so that hundreds of cases fit in seconds; what it answers still
travels through gRPC, as the kubelet would see it. One plugin serves a whole test module: a
case that breaks it breaks every later case, which is exactly what "the process survives"
must catch.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.claim.model import ClaimNotFoundError, ClaimRef
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.plugin import PluginOptions, PluginServer
from agent.prepare.options import PrepareOptions
from discovery.model import Inventory
from protos.dra.v1 import api_pb2, api_pb2_grpc
from tests.fuzz.report import REPORT

DRIVER = "dra-agent.io"
NODE = "fuzz-node"
SPEC_NAME = re.compile(r"k8s\.dra-agent\.io-claim_(?P<uid>[^/]+)\.json")
#: FuzzNode.count kinds that are input cases (the others count outcomes of those cases).
CASE_KINDS = ("claims", "opaque configs", "requests", "huge batch claims")
# The fuzz line of the terminal summary: tests/conftest.py writes it (tests/fuzz/report.py),
# also under pytest-xdist, whose controller never loads this file.


class FuzzClaims:
    """A ClaimSource answering from a dict keyed by (namespace, name); the fuzzer fills it."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Any] = {}

    def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        claim: Mapping[str, Any] | None = self.claims.get((ref.namespace, ref.name))
        if claim is None:
            raise ClaimNotFoundError(str(ref), "not found in the API server")
        return claim  # deliberately unchecked: garbage in is the point


Snapshot = dict[str, tuple[int, int, int]]


def snapshot(root: Path, skip: tuple[Path, ...]) -> Snapshot:
    """Every path under ``root`` but those under ``skip``, with size, mtime and mode."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in [*dirnames, *filenames]:
            st = os.lstat(here / name)
            out[str(here / name)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


@dataclass
class FuzzNode:
    root: Path
    server: PluginServer
    claims: FuzzClaims
    inventory: Inventory
    channel: grpc.Channel
    cases: dict[str, int] = field(default_factory=dict)

    @property
    def cdi_dir(self) -> Path:
        return self.server.preparer.builder.specs.cdi_dir

    @property
    def plugin_dir(self) -> Path:
        return self.server.paths.plugin_dir

    @property
    def stub(self) -> api_pb2_grpc.DRAPluginStub:
        return api_pb2_grpc.DRAPluginStub(self.channel)

    def device_names(self) -> list[str]:
        return sorted(d.name for d in self.inventory.devices)

    def count(self, what: str) -> None:
        self.cases[what] = self.cases.get(what, 0) + 1

    def prepare(self, refs: list[tuple[str, str, str]]) -> Any:
        request = api_pb2.NodePrepareResourcesRequest(
            claims=[api_pb2.Claim(namespace=n, name=c, uid=u) for n, c, u in refs])
        return self.stub.NodePrepareResources(request, timeout=60)

    def unprepare(self, refs: list[tuple[str, str, str]]) -> Any:
        request = api_pb2.NodeUnprepareResourcesRequest(
            claims=[api_pb2.Claim(namespace=n, name=c, uid=u) for n, c, u in refs])
        return self.stub.NodeUnprepareResources(request, timeout=60)

    def outside_state(self) -> Snapshot:
        """What the agent must never touch: everything but the CDI dir, its state dir and its
        registration socket's directory."""
        return snapshot(self.root, (self.cdi_dir, self.plugin_dir,
                                    self.server.paths.registration.parent))

    def spec_files(self) -> dict[str, Path]:
        """Spec files by claim UID; anything else in the CDI dir fails the test."""
        out: dict[str, Path] = {}
        for entry in sorted(self.cdi_dir.iterdir()) if self.cdi_dir.is_dir() else []:
            m = SPEC_NAME.fullmatch(entry.name)
            assert m and entry.is_file() and not entry.is_symlink(), f"stray {entry}"
            out[m["uid"]] = entry
        return out


@pytest.fixture(scope="module")
def fuzz_node() -> Iterator[FuzzNode]:
    from cdi.edits import EditsProvider
    from discovery.scan import DiscoveryOptions, discover
    from discovery.simulate import simulated_sources

    root = Path(tempfile.mkdtemp(prefix="f", dir="/tmp"))
    inventory = discover(simulated_sources("dgx-h100", root / "sim"), DiscoveryOptions())
    (root / "boot_id").write_text("fuzz-boot\n")
    # Bystanders: files beside and above the agent's directories that must stay untouched.
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "kubelet" / "plugins").mkdir(parents=True)
    (root / "kubelet" / "plugins" / "other-driver").mkdir()
    (root / "kubelet" / "plugins" / "other-driver" / "state.json").write_text("{}")
    options = PluginOptions(driver_name=DRIVER, kubelet_dir=root / "kubelet",
                            registration_timeout_s=3600)
    prepare = PrepareOptions(driver_name=DRIVER, node_name=NODE, cdi_dir=root / "cdi",
                             plugin_dir=root / "kubelet" / "plugins" / DRIVER,
                             boot_id_path=root / "boot_id")
    claims = FuzzClaims()
    server = plugin_server(options, prepare, lambda: inventory, EditsProvider(simulated=True),
                           claims, metrics=Metrics())
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.paths.dra}")
    node = FuzzNode(root, server, claims, inventory, channel)
    try:
        yield node
    finally:
        channel.close()
        server.stop(0)
        shutil.rmtree(root, ignore_errors=True)
        REPORT.add_hypothesis({k: n for k, n in node.cases.items() if k in CASE_KINDS})
