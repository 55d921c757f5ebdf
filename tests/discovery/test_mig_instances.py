"""MIG instance management through the GpuLibrary seam: the fake's placement rules (H100 and
A100 tables), and both the real adapter and the fake held against nvidia-ml-py itself."""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from discovery.gpulib import (
    ERRORS_BY_CODE,
    GI_PROFILE_INDEXES,
    GpuLibraryError,
    InsufficientResourcesError,
    InUseError,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
    Placement,
)
from discovery.nvml import NvmlLibrary
from discovery.simulate import A100_80GB_PROFILES, H100_80GB_PROFILES, FakeGpu, FakeMig, FakeNvml

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _lib(name: str = H100, migs: list[FakeMig] | None = None, mig: bool = True) -> FakeNvml:
    gpu = FakeGpu(0, 0, "0000:1b:00.0", name, 85_520_809_984, 0x2330, 9, (9, 0),
                  mig_mode=(1, 1) if mig else (0, 0), migs=migs or [])
    lib = FakeNvml([gpu])
    lib.init()
    return lib


def test_profile_info_by_index_gives_the_profile_ids_of_the_table() -> None:
    lib = _lib()
    h = lib.device_handle_by_index(0)
    infos = [lib.gpu_instance_profile_info(h, i) for i in GI_PROFILE_INDEXES]
    assert [p.id for p in infos] == [19, 20, 15, 14, 9, 5, 0]
    three = infos[4]
    assert (three.slices, three.instance_count, three.memory_mib, three.multiprocessors) == (
        3, 2, 40448, 60)
    with pytest.raises(NotSupportedError):
        lib.gpu_instance_profile_info(h, 5)  # 8-slice profile: not on H100


@pytest.mark.parametrize("name", [H100, A100])
def test_placements_follow_the_lgipp_table(name: str) -> None:
    lib = _lib(name)
    h = lib.device_handle_by_index(0)
    starts = {pid: [p.start for p in lib.gpu_instance_possible_placements(h, pid)]
              for pid in (19, 20, 15, 14, 9, 5, 0)}
    assert starts == {19: list(range(7)), 20: list(range(7)), 15: [0, 2, 4, 6],
                      14: [0, 2, 4], 9: [0, 4], 5: [0], 0: [0]}
    assert {p.size for p in lib.gpu_instance_possible_placements(h, 9)} == {4}


def test_create_gi_and_ci_makes_a_mig_device_that_discovery_sees() -> None:
    lib = _lib()
    h = lib.device_handle_by_index(0)
    gi = lib.create_gpu_instance_with_placement(h, 9, Placement(4, 4))
    assert (gi.profile_id, gi.placement_start, gi.placement_size) == (9, 4, 4)
    with pytest.raises(NotFoundError):  # a GI without a CI is no MIG device yet
        lib.device_mig_device_handle_by_index(h, 0)
    ci = lib.create_compute_instance(h, gi.id, 2)
    assert ci == 0 and lib.compute_instances(h, gi.id) == [0]
    mig = lib.device_mig_device_handle_by_index(h, 0)
    assert lib.device_gpu_instance_id(mig) == gi.id
    assert lib.device_uuid(mig).startswith("MIG-")
    assert lib.device_mig_attributes(mig).memory_mib == 40448
    assert [g.id for g in lib.gpu_instances(h, 9)] == [gi.id]


def test_taken_memory_slices_are_insufficient_resources() -> None:
    lib = _lib(migs=[FakeMig(3, 0, H100_80GB_PROFILES[14], 0)])  # a foreign 2g at 0:2
    h = lib.device_handle_by_index(0)
    with pytest.raises(InsufficientResourcesError) as err:
        lib.create_gpu_instance_with_placement(h, 5, Placement(0, 4))
    assert err.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    gi = lib.create_gpu_instance_with_placement(h, 9, Placement(4, 4))  # beside it: fine
    assert gi.id != 3
    with pytest.raises(InsufficientResourcesError):  # 7g needs every slice
        lib.create_gpu_instance_with_placement(h, 0, Placement(0, 8))


def test_only_one_media_extension_instance_per_gpu() -> None:
    lib = _lib(A100)
    h = lib.device_handle_by_index(0)
    lib.create_gpu_instance_with_placement(h, 20, Placement(0, 1))
    with pytest.raises(InsufficientResourcesError):
        lib.create_gpu_instance_with_placement(h, 20, Placement(3, 1))
    assert A100_80GB_PROFILES[20].ofa_engines == 1


@pytest.mark.parametrize("profile, placement", [(9, Placement(2, 4)), (5, Placement(4, 4)),
                                                (9, Placement(0, 3)), (99, Placement(0, 1))])
def test_a_placement_the_profile_does_not_have_is_invalid_argument(
    profile: int, placement: Placement
) -> None:
    lib = _lib()
    with pytest.raises(InvalidArgumentError) as err:
        lib.create_gpu_instance_with_placement(lib.device_handle_by_index(0), profile, placement)
    assert err.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_without_mig_mode_creation_is_not_supported() -> None:
    lib = _lib(mig=False)
    with pytest.raises(NotSupportedError):
        lib.create_gpu_instance_with_placement(lib.device_handle_by_index(0), 19,
                                               Placement(0, 1))


def test_destroy_order_and_busy_instances_are_in_use() -> None:
    lib = _lib()
    h = lib.device_handle_by_index(0)
    gi = lib.create_gpu_instance_with_placement(h, 19, Placement(6, 1)).id
    lib.create_compute_instance(h, gi, 0)
    with pytest.raises(InUseError) as err:  # a GI that still holds a CI
        lib.destroy_gpu_instance(h, gi)
    assert err.value.code == pynvml.NVML_ERROR_IN_USE
    lib.gpus[0].busy.add(gi)
    with pytest.raises(InUseError):
        lib.destroy_compute_instance(h, gi, 0)
    lib.gpus[0].busy.clear()
    lib.destroy_compute_instance(h, gi, 0)
    assert lib.compute_instances(h, gi) == []
    lib.destroy_gpu_instance(h, gi)
    with pytest.raises(NotFoundError):
        lib.compute_instances(h, gi)
    assert lib.gpus[0].migs == []


def test_a_fault_hook_fails_the_new_calls_too() -> None:
    lib = _lib()
    lib.fail("create_compute_instance", InsufficientResourcesError("x", call="c"))
    h = lib.device_handle_by_index(0)
    gi = lib.create_gpu_instance_with_placement(h, 19, Placement(0, 1)).id
    with pytest.raises(InsufficientResourcesError):
        lib.create_compute_instance(h, gi, 0)


# -- held against nvidia-ml-py --------------------------------------------------------------

class _Recorder:
    """Stands in for the pynvml module: every nvml* call is bound against pynvml's own
    signature (so a wrong name or arity fails) and answered like NVML would."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.raise_code: int | None = None

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # AttributeError: the function does not exist
        if not name.startswith("nvml") or not callable(real):
            return real

        def call(*args: Any) -> Any:
            inspect.signature(real).bind(*args)
            self.calls.append(name)
            if self.raise_code is not None:
                raise pynvml.NVMLError(self.raise_code)
            return self._answer(name, args)

        return call

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "nvmlDeviceGetGpuInstanceProfileInfo":
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = 9, 3, 2, 40448
            return info
        if name == "nvmlDeviceGetGpuInstancePossiblePlacements":
            array, count = args[2], args[3]._obj
            array[0].start, array[0].size, array[1].start, array[1].size = 0, 4, 4, 4
            count.value = 2
            return pynvml.NVML_SUCCESS
        if name in ("nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetComputeInstances"):
            args[3]._obj.value = 1 if args[1] in (9, 2) else 0
            return pynvml.NVML_SUCCESS
        if name == "nvmlGpuInstanceGetInfo":
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.id, info.profileId = 2, 9
            info.placement.start, info.placement.size = 4, 4
            return info
        if name == "nvmlComputeInstanceGetInfo":
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.id = 0
            return info
        return object()


MIG_CALLS: list[tuple[str, Callable[[NvmlLibrary, Any], Any], Any]] = [
    ("profile info", lambda lib, h: lib.gpu_instance_profile_info(h, 2).id, 9),
    ("placements", lambda lib, h: lib.gpu_instance_possible_placements(h, 9),
     [Placement(0, 4), Placement(4, 4)]),
    ("gpu instances", lambda lib, h: [g.id for g in lib.gpu_instances(h, 9)], [2]),
    ("create gi", lambda lib, h: lib.create_gpu_instance_with_placement(
        h, 9, Placement(4, 4)).placement_start, 4),
    ("create ci", lambda lib, h: lib.create_compute_instance(h, 2, 2), 0),
    ("compute instances", lambda lib, h: lib.compute_instances(h, 2), [0]),
    ("destroy ci", lambda lib, h: lib.destroy_compute_instance(h, 2, 0), None),
    ("destroy gi", lambda lib, h: lib.destroy_gpu_instance(h, 2), None),
]


@pytest.mark.parametrize("what, call, expected", MIG_CALLS, ids=[c[0] for c in MIG_CALLS])
def test_the_adapter_calls_pynvml_functions_that_exist_with_our_arity(
    what: str, call: Callable[[NvmlLibrary, Any], Any], expected: Any
) -> None:
    rec = _Recorder()
    lib = NvmlLibrary(module=rec)
    assert call(lib, ctypes.c_void_p()) == expected
    assert rec.calls and all(hasattr(pynvml, c) for c in rec.calls)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
                                  pynvml.NVML_ERROR_IN_USE, pynvml.NVML_ERROR_INVALID_ARGUMENT,
                                  pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_NOT_FOUND])
def test_pynvml_errors_become_the_classes_the_fake_raises(code: int) -> None:
    rec = _Recorder()
    rec.raise_code = code
    with pytest.raises(GpuLibraryError) as err:
        NvmlLibrary(module=rec).create_gpu_instance_with_placement(
            ctypes.c_void_p(), 9, Placement(0, 4))
    assert type(err.value) is ERRORS_BY_CODE[code] and err.value.code == code
    # pynvml has a class of its own for the code, named like ours.
    ours = type(err.value).__name__.removesuffix("Error")
    theirs = type(pynvml.NVMLError(code)).__name__.removeprefix("NVMLError_")
    assert theirs.lower().replace("_", "") == ours.lower().replace("_", "")


def test_the_fake_raises_the_code_nvml_gives_for_each_condition() -> None:
    lib = _lib(migs=[FakeMig(3, 0, H100_80GB_PROFILES[9], 0)])
    h = lib.device_handle_by_index(0)
    cases: list[tuple[Callable[[], Any], int]] = [
        (lambda: lib.create_gpu_instance_with_placement(h, 19, Placement(1, 1)),
         pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
        (lambda: lib.create_gpu_instance_with_placement(h, 19, Placement(7, 1)),
         pynvml.NVML_ERROR_INVALID_ARGUMENT),
        (lambda: lib.destroy_gpu_instance(h, 3), pynvml.NVML_ERROR_IN_USE),
        (lambda: lib.destroy_gpu_instance(h, 9), pynvml.NVML_ERROR_NOT_FOUND),
    ]
    for action, code in cases:
        with pytest.raises(GpuLibraryError) as err:
            action()
        assert err.value.code == code
        assert type(err.value) is ERRORS_BY_CODE[code]
