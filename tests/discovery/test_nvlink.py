"""NVLink domains: which GPUs share NVLink on the simulated machines (bridged pairs, NVSwitch,
an NVL72 tray), what NVML answers that say nothing (no attribute, no warning), reads that
fail (one warning, never a traceback), and the adapter and the fake held against
nvidia-ml-py's own functions and structs."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from discovery.gpulib import (
    ERRORS_BY_CODE,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    NVLINK_MAX_LINKS,
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_SWITCH,
    FabricInfo,
    FunctionNotFoundError,
    GpuIsLostError,
    GpuLibrary,
    GpuLibraryError,
    InvalidArgumentError,
    NotSupportedError,
)
from discovery.model import Device, Inventory
from discovery.nvlink import CLIQUE, DOMAIN, GpuLinks, nvlink_attributes
from discovery.nvml import NvmlLibrary
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import FakeGpu, FakeNvLink, FakeNvml
from discovery.simulate.nvlink_nodes import NVL72_CLIQUE, NVL72_CLUSTER
from discovery.sources import Sources

PAIRS, HGX, NVL72 = "pcie-nvlink-pairs", "hgx-h100-nvswitch", "gb200-nvl72"
NVLINK_KEYS = (DOMAIN, CLIQUE)

SourcesOf = Callable[[str], Sources]


def _gpus(inv: Inventory) -> dict[str, Device]:
    return {d.name: d for d in inv.devices if str(d.type) == "gpu"}


def _domains(inv: Inventory) -> dict[str, object]:
    return {n: d.attributes.get(DOMAIN) for n, d in _gpus(inv).items()}


def _nvlink_warnings(inv: Inventory) -> list[str]:
    return [w for w in inv.warnings if "NVLink" in w or "fabric" in w]


def _fresh(profile_sources: SourcesOf, profile: str) -> tuple[Sources, FakeNvml]:
    """The profile's tree with an NVML fake of its own (faults and edits stay in the test)."""
    sources = profile_sources(profile)
    assert isinstance(sources.gpu, FakeNvml)
    lib = FakeNvml(copy.deepcopy(sources.gpu.gpus), driver=sources.gpu.driver)
    return dataclasses.replace(sources, gpu=lib), lib


def _scan(sources: Sources) -> Inventory:
    return discover(sources, DiscoveryOptions())


# -- the machines ---------------------------------------------------------------------------

def test_bridged_pairs_share_a_domain_named_after_their_lowest_address(
    inventory_of: Callable[[str], Inventory]
) -> None:
    inv = inventory_of(PAIRS)
    gpus = _gpus(inv)
    domains = _domains(inv)
    for a, b in ((0, 1), (2, 3), (4, 5)):
        pair = {gpus[f"gpu-{a}"].host.pci_address, gpus[f"gpu-{b}"].host.pci_address}
        assert domains[f"gpu-{a}"] == domains[f"gpu-{b}"] == min(pair)
    assert len({domains[f"gpu-{k}"] for k in range(6)}) == 3
    # GPUs 6 and 7 have NVLink but no bridge: no domain, and nothing to warn about.
    assert domains["gpu-6"] is None and domains["gpu-7"] is None
    assert _nvlink_warnings(inv) == []
    # Only NVLink tells the pairs: every GPU has a PCIe root of its own.
    roots = {d.attributes["resource.kubernetes.io/pcieRoot"] for d in gpus.values()}
    assert len(roots) == 8
    assert all(CLIQUE not in d.attributes for d in gpus.values())


def test_all_eight_gpus_of_an_nvswitch_hgx_are_one_domain(
    inventory_of: Callable[[str], Inventory]
) -> None:
    inv = inventory_of(HGX)
    domains = _domains(inv)
    assert len(domains) == 8 and set(domains.values()) == {"0000:1b:00.0"}
    assert _nvlink_warnings(inv) == []
    # A single-node fabric (cluster UUID zero) is no clique.
    assert all(CLIQUE not in d.attributes for d in _gpus(inv).values())


def test_before_the_fabric_manager_ran_an_hgx_has_no_domain(
    inventory_of: Callable[[str], Inventory]
) -> None:
    inv = inventory_of("dgx-h100")
    assert set(_domains(inv).values()) == {None}
    assert _nvlink_warnings(inv) == []


def test_an_nvl72_tray_publishes_its_fabric_clique(
    inventory_of: Callable[[str], Inventory]
) -> None:
    inv = inventory_of(NVL72)
    clique = f"{NVL72_CLUSTER}.{NVL72_CLIQUE}"
    assert len(clique) <= 64
    for d in _gpus(inv).values():
        assert (d.attributes[DOMAIN], d.attributes[CLIQUE]) == (clique, clique)
    assert len(_gpus(inv)) == 4 and _nvlink_warnings(inv) == []


def test_mig_devices_and_gpus_without_nvlink_get_no_nvlink_attribute(
    inventory_of: Callable[[str], Inventory]
) -> None:
    for profile in ("dgx-a100-mig", "sriov-nic", "amd-mi300x"):
        inv = inventory_of(profile)
        assert not [d.name for d in inv.devices if set(NVLINK_KEYS) & set(d.attributes)]
        assert _nvlink_warnings(inv) == []


def test_a_gpu_in_mig_mode_leaves_its_bridge_partner_alone(profile_sources: SourcesOf) -> None:
    sources, lib = _fresh(profile_sources, PAIRS)
    lib.gpus[1].mig_mode = (1, 1)
    domains = _domains(_scan(sources))
    assert "gpu-1" not in domains and domains["gpu-0"] is None
    assert domains["gpu-2"] == domains["gpu-3"] is not None


def test_one_sided_links_still_join_a_pair(profile_sources: SourcesOf) -> None:
    sources, lib = _fresh(profile_sources, PAIRS)
    lib.gpus[1].nvlinks.clear()  # gpu-1 reports its links down; gpu-0 still sees them
    domains = _domains(_scan(sources))
    assert domains["gpu-0"] == domains["gpu-1"] == lib.gpus[0].bdf


# -- NVML that says nothing, and reads that fail -------------------------------------------

def test_a_link_read_failing_mid_scan_is_one_warning_and_that_gpu_alone_is_left_out(
    profile_sources: SourcesOf
) -> None:
    sources, lib = _fresh(profile_sources, HGX)
    lib.fail("device_nvlink_remote_pci_bus_id", GpuLibraryError("Unknown Error"),
             uuid=lib.gpus[3].uuid)
    inv = _scan(sources)
    (warning,) = _nvlink_warnings(inv)
    assert warning.startswith("gpu-3: NVLink 0 unreadable, GPU left out of NVLink domains")
    domains = _domains(inv)
    assert domains.pop("gpu-3") is None and set(domains.values()) == {"0000:1b:00.0"}


def test_a_failed_gpu_never_joins_its_partner_to_anything(profile_sources: SourcesOf) -> None:
    sources, lib = _fresh(profile_sources, PAIRS)
    lib.fail("device_nvlink_state", GpuIsLostError("GPU is lost"), uuid=lib.gpus[1].uuid)
    inv = _scan(sources)
    assert len(_nvlink_warnings(inv)) == 1 and "gpu-1" in _nvlink_warnings(inv)[0]
    domains = _domains(inv)
    assert domains["gpu-0"] is None and domains["gpu-1"] is None
    assert domains["gpu-2"] == domains["gpu-3"] is not None


@pytest.mark.parametrize("call", ["device_nvlink_state", "device_gpu_fabric_info"])
@pytest.mark.parametrize("error", [NotSupportedError, FunctionNotFoundError])
def test_an_unsupported_call_is_no_attribute_and_no_warning(
    profile_sources: SourcesOf, call: str, error: type[GpuLibraryError]
) -> None:
    sources, lib = _fresh(profile_sources, NVL72)
    lib.fail(call, error("Not Supported", call=call))
    inv = _scan(sources)
    assert _nvlink_warnings(inv) == []
    # Without links the fabric still names the clique; without the fabric call there is none
    # (the tray's switches are off the node, so its links alone join nothing).
    want = f"{NVL72_CLUSTER}.{NVL72_CLIQUE}" if call == "device_nvlink_state" else None
    assert set(_domains(inv).values()) == {want}


def test_a_driver_that_cannot_say_what_is_at_the_far_end_still_groups(
    profile_sources: SourcesOf
) -> None:
    for profile, expected in ((PAIRS, 3), (HGX, 1)):
        sources, lib = _fresh(profile_sources, profile)
        lib.fail("device_nvlink_remote_device_type", NotSupportedError("Not Supported"))
        inv = _scan(sources)
        values = {v for v in _domains(inv).values() if v is not None}
        assert len(values) == expected and _nvlink_warnings(inv) == []


def test_unreadable_fabric_info_is_one_warning_and_the_links_still_count(
    profile_sources: SourcesOf
) -> None:
    sources, lib = _fresh(profile_sources, HGX)
    lib.fail("device_gpu_fabric_info", GpuLibraryError("Unknown Error"),
             uuid=lib.gpus[0].uuid)
    inv = _scan(sources)
    assert [w.split(":")[0] for w in _nvlink_warnings(inv)] == ["gpu-0"]
    assert set(_domains(inv).values()) == {"0000:1b:00.0"}


def test_a_remote_address_that_is_no_pci_address_is_one_warning(
    profile_sources: SourcesOf
) -> None:
    sources, lib = _fresh(profile_sources, PAIRS)

    class Garbled(FakeNvml):
        def device_nvlink_remote_pci_bus_id(self, handle: Any, link: int) -> str:
            super().device_nvlink_remote_pci_bus_id(handle, link)
            return "not-a-bus-id"

    inv = _scan(dataclasses.replace(sources, gpu=Garbled(lib.gpus)))
    assert len(_nvlink_warnings(inv)) == 6  # one per bridged GPU, never one per link
    assert set(_domains(inv).values()) == {None}


@pytest.mark.parametrize("fabric", [
    FabricInfo(NVL72_CLUSTER, 1, FABRIC_STATE_IN_PROGRESS, 0),  # still registering
    FabricInfo(NVL72_CLUSTER, 1, FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_UNKNOWN),
    FabricInfo("00000000-0000-0000-0000-000000000000", 1, FABRIC_STATE_COMPLETED, 0),
], ids=["in-progress", "failed", "zero-cluster"])
def test_a_fabric_that_is_not_attached_gives_no_clique(
    profile_sources: SourcesOf, fabric: FabricInfo
) -> None:
    sources, lib = _fresh(profile_sources, NVL72)
    for gpu in lib.gpus:
        gpu.fabric = fabric
    inv = _scan(sources)
    assert set(_domains(inv).values()) == {None} and _nvlink_warnings(inv) == []


def test_a_gpu_cut_to_the_api_limits_keeps_its_nvlink_attributes() -> None:
    from discovery.attrs import fit_limits
    from discovery.model import DeviceType

    # "nvlink..." sorts last but one of the droppable names: without the keep list it goes.
    attrs: dict[str, object] = {f"extra{i:02d}": i for i in range(40)}
    attrs.update({DOMAIN: "0000:18:00.0", CLIQUE: f"{NVL72_CLUSTER}.1", "zz": 1})
    fitted = fit_limits(Device("gpu-0", DeviceType.GPU, attrs, {}))  # type: ignore[arg-type]
    assert len(fitted.attributes) == 31
    assert fitted.attributes[DOMAIN] == "0000:18:00.0" and CLIQUE in fitted.attributes


def test_domains_do_not_depend_on_the_order_gpus_are_read_in() -> None:
    a, b, c, d = "0000:18:00.0", "0000:2b:00.0", "0000:3e:00.0", "0000:51:00.0"
    links = [GpuLinks(b, frozenset({a}), frozenset()), GpuLinks(a, frozenset({b}), frozenset()),
             GpuLinks(d, frozenset(), frozenset({"0000:05:00.0"})),
             GpuLinks(c, frozenset(), frozenset({"0000:05:00.0"}))]
    first = nvlink_attributes(links)
    assert first == nvlink_attributes(reversed(links))
    assert {k: v[DOMAIN] for k, v in first.items()} == {a: a, b: a, c: c, d: c}


# -- held against nvidia-ml-py ----------------------------------------------------------------

NVLINK_METHODS = ("device_nvlink_state", "device_nvlink_remote_pci_bus_id",
                  "device_nvlink_remote_device_type", "device_gpu_fabric_info")


@pytest.mark.parametrize("method", NVLINK_METHODS)
def test_the_fake_and_the_adapter_have_the_protocols_signature(method: str) -> None:
    want = inspect.signature(getattr(GpuLibrary, method))
    for impl in (FakeNvml, NvmlLibrary):
        got = inspect.signature(getattr(impl, method))
        assert list(got.parameters) == list(want.parameters), impl


class _Pynvml:
    """Stands in for the pynvml module: each nvml* call is bound against pynvml's own
    signature and answered with pynvml's own structs, filled as libnvidia-ml fills them."""

    def __init__(self, missing: frozenset[str] = frozenset(), code: int | None = None) -> None:
        self.calls: list[str] = []
        self.missing = missing  # functions the "driver" lacks: FUNCTION_NOT_FOUND
        self.code = code

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)
        if not name.startswith("nvml") or not callable(real):
            return real

        def call(*args: Any) -> Any:
            inspect.signature(real).bind(*args)
            self.calls.append(name)
            if name in self.missing:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if self.code is not None:
                raise pynvml.NVMLError(self.code)
            return self._answer(name, args)

        return call

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "nvmlDeviceGetNvLinkState":
            return pynvml.NVML_FEATURE_ENABLED if args[1] < 2 else pynvml.NVML_FEATURE_DISABLED
        if name == "nvmlDeviceGetNvLinkRemotePciInfo":
            info = pynvml.nvmlPciInfo_t()
            info.busId = b"00000000:2B:00.0"
            return info
        if name == "nvmlDeviceGetNvLinkRemoteDeviceType":
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if name in ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"):
            info = args[1]._obj
            if name.endswith("V"):
                assert info.version == pynvml.nvmlGpuFabricInfo_v2
            ctypes.memmove(info.clusterUuid, uuid.UUID(NVL72_CLUSTER).bytes, 16)
            info.cliqueId, info.state = 7, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            info.status = pynvml.NVML_SUCCESS
            return pynvml.NVML_SUCCESS
        raise AssertionError(f"unexpected call {name}")


CALLS: list[tuple[str, Callable[[NvmlLibrary, Any], Any], Any]] = [
    ("state", lambda lib, h: [lib.device_nvlink_state(h, i) for i in range(3)],
     [True, True, False]),
    ("remote pci", lambda lib, h: lib.device_nvlink_remote_pci_bus_id(h, 0), "00000000:2B:00.0"),
    ("remote type", lambda lib, h: lib.device_nvlink_remote_device_type(h, 0),
     NVLINK_REMOTE_SWITCH),
    ("fabric", lambda lib, h: lib.device_gpu_fabric_info(h),
     FabricInfo(NVL72_CLUSTER, 7, FABRIC_STATE_COMPLETED, 0)),
]


@pytest.mark.parametrize("what, call, expected", CALLS, ids=[c[0] for c in CALLS])
def test_the_adapter_calls_pynvml_as_pynvml_defines_it(
    what: str, call: Callable[[NvmlLibrary, Any], Any], expected: Any
) -> None:
    fake = _Pynvml()
    assert call(NvmlLibrary(module=fake), ctypes.c_void_p()) == expected
    assert fake.calls


def test_a_driver_without_the_versioned_fabric_call_is_asked_the_old_one() -> None:
    fake = _Pynvml(missing=frozenset({"nvmlDeviceGetGpuFabricInfoV"}))
    info = NvmlLibrary(module=fake).device_gpu_fabric_info(ctypes.c_void_p())
    assert info.attached and info.clique_id == 7
    assert fake.calls == ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"]
    both = _Pynvml(missing=frozenset({"nvmlDeviceGetGpuFabricInfoV",
                                      "nvmlDeviceGetGpuFabricInfo"}))
    with pytest.raises(NotSupportedError):  # FunctionNotFoundError is one
        NvmlLibrary(module=both).device_gpu_fabric_info(ctypes.c_void_p())


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_INVALID_ARGUMENT,
                                  pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                                  pynvml.NVML_ERROR_GPU_IS_LOST])
def test_pynvml_errors_of_the_link_calls_become_our_classes(code: int) -> None:
    lib = NvmlLibrary(module=_Pynvml(code=code))
    with pytest.raises(GpuLibraryError) as err:
        lib.device_nvlink_state(ctypes.c_void_p(), 0)
    assert type(err.value) is ERRORS_BY_CODE[code] and err.value.code == code


def test_the_fake_answers_with_the_codes_nvml_documents() -> None:
    plain = FakeGpu(0, 0, "0000:18:00.0", "NVIDIA H100 NVL", 1 << 30, 0x2321, 9, (9, 0))
    linked = FakeGpu(1, 1, "0000:2b:00.0", "NVIDIA H100 NVL", 1 << 30, 0x2321, 9, (9, 0),
                     nvlink_count=18, nvlinks={0: FakeNvLink(plain.bdf, NVLINK_REMOTE_GPU)})
    lib = FakeNvml([plain, linked])
    lib.init()
    h0, h1 = lib.device_handle_by_index(0), lib.device_handle_by_index(1)
    cases: list[tuple[Callable[[], Any], int]] = [
        (lambda: lib.device_nvlink_state(h0, 0), pynvml.NVML_ERROR_NOT_SUPPORTED),
        (lambda: lib.device_nvlink_state(h1, 18), pynvml.NVML_ERROR_INVALID_ARGUMENT),
        (lambda: lib.device_nvlink_state(h1, NVLINK_MAX_LINKS),
         pynvml.NVML_ERROR_INVALID_ARGUMENT),
        (lambda: lib.device_gpu_fabric_info(h1), pynvml.NVML_ERROR_NOT_SUPPORTED),
    ]
    for action, code in cases:
        with pytest.raises(GpuLibraryError) as err:
            action()
        assert err.value.code == code and type(err.value) is ERRORS_BY_CODE[code]
    assert lib.device_nvlink_state(h1, 0) and not lib.device_nvlink_state(h1, 1)
    assert lib.device_nvlink_remote_pci_bus_id(h1, 0) == "00000000:18:00.0"
    assert lib.device_nvlink_remote_device_type(h1, 0) == NVLINK_REMOTE_GPU
    with pytest.raises(InvalidArgumentError):
        lib.device_nvlink_remote_device_type(h1, -1)
