"""docs/devices.md's "GPU passthrough to VMs" says what happens: its claim is allocated a GPU's
VFIO form by the scheduler's rules and prepared for a VM, and the refusal it quotes is the
agent's own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.claim.parse import parse_claim
from agent.explain import explain
from agent.explain.docs import packaged_classes
from agent.inventory import slice_objects
from agent.prepare.effects.passthrough import PassthroughError
from discovery.pools import build_resources
from tests.passthrough.node import driver_of, make_node, preparer, published, vm_claim
from tests.plugnode import DRIVER, NODE

SECTION = "## GPU passthrough to VMs"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "devices.md"


def _section() -> str:
    text = DOCS.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _claim_from_docs() -> dict[str, Any]:
    (block,) = re.findall(r"```yaml\n(.*?)```", _section(), flags=re.S)
    template = yaml.safe_load(block)
    assert template["kind"] == "ResourceClaimTemplate"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-gpu-x7k2p", "namespace": "default",
                         "uid": "6f1c1f43-0b9e-4d53-9b0e-2d1c8a1e7a11"},
            "spec": template["spec"]["spec"]}


def test_the_documented_claim_gets_a_gpu_for_a_vm(tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    slices = slice_objects(build_resources(node.inventory(), NODE), DRIVER, NODE)
    claim = _claim_from_docs()
    result = explain(claim, packaged_classes(), slices, NODE)
    assert result.fits and result.allocation is not None
    claim["status"] = {"allocation": result.allocation}
    (chosen,) = result.allocation["devices"]["results"]
    assert published(node)[chosen["device"]].type == "vfio"

    record = node.prepare(parse_claim(claim))
    bdf = record.devices[0].pci_address
    assert bdf is not None and driver_of(tmp_path, bdf) == "vfio-pci"
    (meta,) = (tmp_path / "metadata").rglob("metadata.json")
    (entry,) = json.loads(meta.read_text())["requests"][0]["devices"]
    assert entry["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": bdf}


def test_the_documented_refusal_is_the_agents_own(tmp_path: Path) -> None:
    (quoted,) = re.findall(r"```\n(device gpu-vfio.*?)```", _section(), flags=re.S)
    make_node(tmp_path, "nvidia")
    with pytest.raises(PassthroughError) as err:
        preparer(tmp_path).prepare(parse_claim(vm_claim("gpu-vfio-0000-5e-00-0")))
    assert err.value.message == " ".join(quoted.split())
