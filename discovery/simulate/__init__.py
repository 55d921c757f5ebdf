"""Simulated hardware: generated sysfs/procfs/dev trees plus an NVML fake.

``simulated_sources(profile, workdir)`` returns ``Sources`` that the normal discovery code
reads, so ``--simulate`` exercises exactly the code paths of a real node.
"""

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
