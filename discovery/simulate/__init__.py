"""Simulated hardware: generated sysfs/procfs/dev trees plus an NVML fake.

``simulated_sources(profile, workdir)`` returns ``Sources`` that the normal discovery code
reads, so ``--simulate`` exercises exactly the code paths of a real node.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from discovery.simulate.fake_nvml import (
        A100_80GB_PROFILES,
        H100_80GB_PROFILES,
        FakeGpu,
        FakeMig,
        FakeNvLink,
        FakeNvml,
        GiProfile,
    )
    from discovery.simulate.profiles import (
        PROFILES,
        ProfileError,
        scratch_dir,
        simulated_sources,
    )

#: name -> the submodule that defines it, loaded on first use (PEP 562): a process that
#: needs only the NVML fake (``discovery.simulate.fake_nvml``) does not load every profile's
#: tree generator with it.
_WHERE = {
    "A100_80GB_PROFILES": "fake_nvml", "H100_80GB_PROFILES": "fake_nvml", "FakeGpu": "fake_nvml",
    "FakeMig": "fake_nvml", "FakeNvLink": "fake_nvml", "FakeNvml": "fake_nvml",
    "GiProfile": "fake_nvml",
    "PROFILES": "profiles", "ProfileError": "profiles", "scratch_dir": "profiles",
    "simulated_sources": "profiles",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


__all__ = [
    "A100_80GB_PROFILES",
    "H100_80GB_PROFILES",
    "PROFILES",
    "FakeGpu",
    "FakeMig",
    "FakeNvLink",
    "FakeNvml",
    "GiProfile",
    "ProfileError",
    "scratch_dir",
    "simulated_sources",
]
