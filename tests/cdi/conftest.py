"""Fixtures of the CDI tests: fake hosts, inventory devices and the real CDI checker."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Device, DeviceType, HostInfo
from tests.cdi.fakeroot import FakeHost
from tests.conftest import REPO

SCHEMA = REPO / "tests" / "data" / "cdi-schema" / "schema.json"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    fake = FakeHost(tmp_path / "host")
    for d in (fake.root, fake.dev, fake.proc, fake.sys):
        d.mkdir(parents=True)
    return fake


@dataclass
class Checker:
    """The reference CDI library (0.5.2) behind hack/cdi-check.sh."""

    bin: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin), *args], capture_output=True, text=True, timeout=60, check=False
        )

    def validate(self, path: Path) -> str:
        out = self.run("validate", str(path))
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def schema(self, path: Path) -> None:
        out = self.run("schema", str(SCHEMA), str(path))
        assert out.returncode == 0, out.stdout + out.stderr

    def inject(self, spec_dir: Path, *devices: str) -> dict[str, Any]:
        out = self.run("inject", str(spec_dir), *devices)
        assert out.returncode == 0, out.stdout + out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result


@pytest.fixture(scope="session")
def checker(cdi_check_bin: Path) -> Checker:
    return Checker(cdi_check_bin)


def gpu(name: str = "gpu-0", minor: int = 0, pci: str = "0000:1b:00.0") -> Device:
    return Device(
        name=name,
        type=DeviceType.GPU,
        attributes={},
        capacity={},
        host=HostInfo(pci_address=pci, vendor="nvidia", uuid=f"GPU-{minor:08d}", minor=minor),
    )


def mig(name: str = "gpu-0-mig-1g10gb-0", minor: int = 0, gi: int = 1, ci: int = 0) -> Device:
    return Device(
        name=name,
        type=DeviceType.MIG,
        attributes={},
        capacity={},
        host=HostInfo(vendor="nvidia", uuid="MIG-1", parent_uuid=f"GPU-{minor:08d}",
                      minor=minor, mig_gi=gi, mig_ci=ci),
    )  # fmt: skip


def nic(name: str = "nic-0", if_name: str | None = "ibp24s0", rdma: str | None = "mlx5_0",
        pci: str = "0000:18:00.0") -> Device:  # fmt: skip
    return Device(
        name=name,
        type=DeviceType.NIC,
        attributes={},
        capacity={},
        host=HostInfo(pci_address=pci, vendor="mellanox", if_name=if_name, rdma_device=rdma),
    )


def vf(name: str = "vf-0", pci: str = "0000:2a:00.1", group: str | None = None) -> Device:
    return Device(
        name=name,
        type=DeviceType.VF,
        attributes={},
        capacity={},
        host=HostInfo(pci_address=pci, vendor="mellanox", driver="vfio-pci", iommu_group=group),
    )


def dri_gpu(name: str, vendor: str, pci: str) -> Device:
    return Device(
        name=name, type=DeviceType.GPU, attributes={}, capacity={},
        host=HostInfo(pci_address=pci, vendor=vendor),
    )  # fmt: skip
