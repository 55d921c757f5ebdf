"""CDI benchmark: per-claim spec generation with a warm cache, and cold driver discovery.

A fixture NVIDIA driver installation (real ELF libraries, a binary ld.so.cache, char device
nodes) is built in a temporary directory, so the figures need no GPU. Per-claim generation is
what prepare pays on top of its file writes: ``edits_for`` per device, ``common_edits_for``
(cached), building the Spec and serialising it; the goal is <= 2 ms for 8 GPUs. Cold discovery
is the first claim after start-up or a driver upgrade (a new provider each time).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from cdi.edits import EditsProvider
from cdi.spec import CDIDevice, Spec
from discovery.model import Device, DeviceType, HostInfo
from hack.benches import Figure, median_ms
from tests.cdi.fakeroot import FakeHost

KIND = "k8s.dra-agent.io/claim"
UID = "0b7c3f52-1e2d-4c5b-8a9f-7d6e5c4b3a21"


def _gpus(count: int) -> list[Device]:
    return [
        Device(f"gpu-{m}", DeviceType.GPU, {}, {},
               HostInfo(pci_address=f"0000:{0x1b + m:02x}:00.0", vendor="nvidia", minor=m))
        for m in range(count)
    ]  # fmt: skip


def _claim_spec(provider: EditsProvider, devices: list[Device]) -> bytes:
    spec = Spec(
        KIND,
        tuple(CDIDevice(f"{UID}-{d.name}", provider.edits_for(d)) for d in devices),
        provider.common_edits_for(devices),
    )
    spec.validate()
    return json.dumps(spec.to_dict(), indent=2).encode()



def _host(base: Path, hook: str | None) -> FakeHost:
    host = FakeHost(base)
    for d in (host.root, host.dev, host.proc, host.sys):
        d.mkdir(parents=True)
    host.install_driver(hook=hook)
    host.make_control_nodes()
    for m in range(8):
        host.add_gpu(m, f"0000:{0x1B + m:02x}:00.0")
    return host


def run(quick: bool) -> list[Figure]:
    rounds = 50 if quick else 500
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="dra-agent-cdi-bench-") as tmp:
        for label, hook in (("hook-less", None), ("with hook", "1.18.0")):
            host = _host(Path(tmp) / label.replace(" ", "-"), hook)

            def provider(host: FakeHost = host) -> EditsProvider:
                return EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys)

            warm = provider()
            for count in (1, 8):
                devices = _gpus(count)
                _claim_spec(warm, devices)  # fill the cache
                value = median_ms(lambda w=warm, d=devices: _claim_spec(w, d), rounds)
                figures.append(Figure(
                    f"cdi claim spec, {count} GPU(s), warm cache, {label}, median",
                    value, "ms", "<= 2 ms", value <= 2.0))  # fmt: skip
            cold_rounds = 5 if quick else 30
            value = median_ms(lambda: provider().common_edits_for(_gpus(1)), cold_rounds)
            figures.append(Figure(f"cdi cold driver discovery, {label}, median", value, "ms"))
    return figures


if __name__ == "__main__":
    import sys

    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
