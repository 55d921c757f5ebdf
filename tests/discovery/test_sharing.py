"""``--sharing``: each mode's published form on the simulated machines, the devices that stay
exclusive and why, and every bad value as one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from agent.slices.validate import validate_pool
from discovery.model import Device, DeviceType, HostInfo
from discovery.pools import build_resources
from discovery.report import table
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import (
    SharingError,
    apply_sharing,
    enforcement,
    parse_sharing,
    parse_sharing_list,
    shareable,
)
from discovery.sources import Sources


def _discover(profile_sources: Callable[[str], Sources], profile: str,
              *modes: str) -> Any:
    return discover(profile_sources(profile),
                    DiscoveryOptions(sharing=parse_sharing_list(modes)))


def _api(device: Device) -> dict[str, Any]:
    return device.to_api()


def test_gpu_shares_on_dgx_h100(profile_sources: Callable[[str], Sources]) -> None:
    inv = _discover(profile_sources, "dgx-h100", "gpu=shares:4")
    gpus = [d for d in inv.devices if d.type == DeviceType.GPU]
    assert len(gpus) == 8
    api = _api(gpus[0])
    assert api["allowMultipleAllocations"] is True
    assert api["attributes"]["sharing"] == {"string": "shares"}
    assert api["capacity"]["shares"] == {"value": "4", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}
    # memory is still published (selectors read it) but no share consumes it
    assert api["capacity"]["memory"] == {"value": "81559Mi", "requestPolicy": {
        "default": "0", "validValues": ["0"]}}
    # the NICs are left exclusive
    nics = [d for d in inv.devices if d.type == DeviceType.NIC]
    assert nics and not any(d.allow_multiple_allocations for d in nics)
    assert "allowMultipleAllocations" not in _api(nics[0])


def test_gpu_memory_in_steps(profile_sources: Callable[[str], Sources]) -> None:
    inv = _discover(profile_sources, "dgx-h100", "gpu=memory:10Gi")
    gpu = next(d for d in inv.devices if d.type == DeviceType.GPU)
    # 81559Mi holds 7 whole steps of 10Gi: max is 70Gi, the value stays the real size
    assert _api(gpu)["capacity"] == {"memory": {"value": "81559Mi", "requestPolicy": {
        "default": "10Gi", "validRange": {"min": "10Gi", "max": "70Gi", "step": "10Gi"}}}}
    assert _api(gpu)["attributes"]["sharing"] == {"string": "memory"}


def test_default_memory_step_is_one_gib(profile_sources: Callable[[str], Sources]) -> None:
    inv = _discover(profile_sources, "dgx-h100", "gpu=memory")
    gpu = next(d for d in inv.devices if d.type == DeviceType.GPU)
    policy = gpu.request_policies["memory"]
    assert (policy.default, policy.min, policy.max, policy.step) == ("1Gi", "1Gi", "79Gi", "1Gi")


def test_amd_gpus_share_their_vram(profile_sources: Callable[[str], Sources]) -> None:
    plain = discover(profile_sources("amd-mi300x"))
    gpus = [d for d in plain.devices if d.type == DeviceType.GPU]
    assert len(gpus) == 8 and all(d.host.vendor == "amd" for d in gpus)
    assert gpus[0].capacity == {"memory": "196608Mi"}  # 192 GiB from mem_info_vram_total
    assert "/dev/kfd" in gpus[0].host.dev_nodes
    shared = _discover(profile_sources, "amd-mi300x", "gpu=memory:16Gi")
    gpu = next(d for d in shared.devices if d.type == DeviceType.GPU)
    assert gpu.request_policies["memory"].max == "192Gi"
    assert enforcement(gpu) == "scheduling only: nothing bounds one share's use"


def test_nic_modes_on_sriov_nic(profile_sources: Callable[[str], Sources]) -> None:
    inv = _discover(profile_sources, "sriov-nic", "nic=bandwidth:25G")
    pfs = [d for d in inv.devices if d.type == DeviceType.NIC]
    vfs = [d for d in inv.devices if d.type == DeviceType.VF]
    assert len(pfs) == 2 and vfs
    assert _api(pfs[0])["capacity"]["bandwidth"] == {"value": "100G", "requestPolicy": {
        "default": "25G", "validRange": {"min": "25G", "max": "100G", "step": "25G"}}}
    assert not any(d.allow_multiple_allocations for d in vfs)  # a VF is one pod's
    inv = _discover(profile_sources, "sriov-nic", "nic=shares:8")
    pf = next(d for d in inv.devices if d.type == DeviceType.NIC)
    assert pf.capacity["shares"] == "8" and pf.request_policies["shares"].max == "8"


def test_shared_slices_pass_validation_and_the_schema(
    profile_sources: Callable[[str], Sources], slice_validator: Any
) -> None:
    inv = _discover(profile_sources, "dgx-h100", "gpu=shares:8", "nic=bandwidth")
    resources = build_resources(inv, "node-a")
    for name, pool in resources.pools.items():
        assert validate_pool("dra-agent.io", name, pool) == []
        for piece in pool.slices:
            obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                   "metadata": {"name": "x"},
                   "spec": {"driver": "dra-agent.io", "nodeName": "node-a",
                            "pool": {"name": name, "generation": 1,
                                     "resourceSliceCount": len(pool.slices)},
                            "devices": list(piece.devices)}}
            errors = sorted(slice_validator.iter_errors(obj), key=str)
            assert errors == [], errors[0].message if errors else ""


def test_a_device_without_what_its_mode_divides_stays_exclusive() -> None:
    intel = Device("gpu-0000-4d-00-0", DeviceType.GPU, {"vendor": "intel"}, {},
                   HostInfo(vendor="intel"))
    down = Device("nic-a", DeviceType.NIC, {}, {}, HostInfo(extra={"speedMbps": "-1"}))
    slow = Device("nic-b", DeviceType.NIC, {}, {}, HostInfo(extra={"speedMbps": "1000"}))
    warnings: list[str] = []
    out = apply_sharing([intel], (parse_sharing("gpu=memory"),), warnings)
    out += apply_sharing([down, slow], (parse_sharing("nic=bandwidth:10G"),), warnings)
    assert out == [intel, down, slow]
    assert warnings == [
        "gpu-0000-4d-00-0: not shared (gpu=memory:1Gi): its memory size is unknown (the "
        "driver reports none); published exclusive",
        "nic-a: not shared (nic=bandwidth:10G): its link is down or its speed unknown; "
        "published exclusive",
        "nic-b: not shared (nic=bandwidth:10G): its link speed (1G) is below one step of "
        "10G; published exclusive",
    ]


def test_shares_need_nothing_from_the_device() -> None:
    intel = Device("gpu-x", DeviceType.GPU, {"vendor": "intel"}, {}, HostInfo(vendor="intel"))
    shared, why = shareable(intel, parse_sharing("gpu=shares:2"))
    assert why is None and shared is not None
    assert shared.capacity == {"shares": "2"} and shared.allow_multiple_allocations


def test_odd_link_speeds_are_published_in_megabits() -> None:
    nic = Device("nic-c", DeviceType.NIC, {}, {}, HostInfo(extra={"speedMbps": "2500"}))
    shared, _ = shareable(nic, parse_sharing("nic=bandwidth:500M"))
    assert shared is not None
    assert shared.capacity["bandwidth"] == "2500M"
    assert shared.request_policies["bandwidth"].max == "2500M"


@pytest.mark.parametrize(("value", "message"), [
    ("gpu", "expected TYPE=MODE such as gpu=shares:4, got 'gpu'"),
    ("mig=shares:2", "mig devices cannot be shared: a MIG device is already a partition"),
    ("vf=shares:2", "vf devices cannot be shared: an SR-IOV VF is the part of a NIC"),
    ("tpu=shares:2", "unknown device type 'tpu'; sharing applies to gpu and nic"),
    ("gpu=bandwidth", "unknown mode 'bandwidth' for gpu; use gpu=shares:N or gpu=memory"),
    ("nic=memory", "unknown mode 'memory' for nic; use nic=shares:N or nic=bandwidth"),
    ("gpu=shares:0", "gpu=shares:0: N must be 1 to 1024"),
    ("gpu=shares:-3", "gpu=shares:-3: N must be 1 to 1024"),
    ("gpu=shares:2000", "gpu=shares:2000: N must be 1 to 1024"),
    ("gpu=shares:two", "gpu=shares:N needs a whole number N, got 'two'"),
    ("gpu=shares:", "gpu=shares:N needs a whole number N, got ''"),
    ("gpu=memory:0Gi", "step '0Gi' is not a positive whole quantity"),
    ("gpu=memory:1.5Gi", "step '1.5Gi' is not a positive whole quantity"),
    ("nic=bandwidth:10Gi", "step '10Gi' is not a positive whole quantity with k, M, G or T"),
])
def test_bad_values_are_one_line(value: str, message: str) -> None:
    with pytest.raises(SharingError) as err:
        parse_sharing(value)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_one_mode_per_type() -> None:
    with pytest.raises(SharingError, match="gpu is given twice"):
        parse_sharing_list(["gpu=shares:2", "gpu=memory"])
    assert [str(m) for m in parse_sharing_list(["gpu=shares:2", "nic=bandwidth"])] == [
        "gpu=shares:2", "nic=bandwidth:1G"]


def test_wide_table_says_what_enforces_a_share(
    profile_sources: Callable[[str], Sources]
) -> None:
    inv = _discover(profile_sources, "dgx-h100", "gpu=shares:4", "nic=shares:2")
    text = table(inv, wide=True)
    assert "shared=shares:4" in text
    lines = text.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith("SHARED")))
    assert lines[start + 1].startswith("gpu-0 (+7 more)")
    assert "time-sliced by the NVIDIA driver" in lines[start + 1]
    assert "scheduling only" in lines[start + 2]
    assert "SHARED" not in table(inv)  # the plain table stays as it was


def test_exclusive_discovery_is_unchanged(profile_sources: Callable[[str], Sources]) -> None:
    plain = discover(profile_sources("dgx-h100"))
    assert not any(d.allow_multiple_allocations or d.request_policies for d in plain.devices)
    assert all("sharing" not in d.attributes for d in plain.devices)
    same = replace(plain.devices[0])
    assert same.to_api() == plain.devices[0].to_api()
