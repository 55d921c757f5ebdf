"""``discovery.simulate`` loads its parts on first use: the NVML fake alone (the start-up
bench's node layout) does not bring every profile's tree generator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_simulate_fake_nvml_loads_no_profile() -> None:
    code = ("import sys, discovery.simulate.fake_nvml; "
            "print(sorted(m for m in sys.modules if m.startswith('discovery.simulate')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert out == "['discovery.simulate', 'discovery.simulate.fake_nvml']"
    import discovery.simulate as simulate

    for name in simulate.__all__:
        assert getattr(simulate, name) is not None
