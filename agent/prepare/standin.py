"""What the GPU tools the agent drives share: finding the driver's binary, and the state file
a simulated node's stand-in keeps (``RecordingGpuControl``, ``RecordingMpsControl``).

The stand-ins keep what was set in a JSON file beside the checkpoint, as a GPU keeps its
settings when the agent dies: a restarted agent (or a crash test's next process) meets what the
dead one set. An unreadable file is an empty state, as after a reboot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cdi.atomicfile import write_atomic


def find_driver_tool(driver_root: Path, name: str) -> Path | None:
    """``name`` of the driver the node runs: under ``driver_root`` first (a containerised
    driver), else on PATH."""
    for candidate in (driver_root / "usr" / "bin" / name, driver_root / "bin" / name):
        if candidate.is_file():
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def load_state(path: Path) -> dict[str, Any]:
    """The stand-in's state as last saved; empty when missing or unreadable."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file at once (a reader never sees half of it); not fsynced: it
    stands in for hardware state, which a power loss resets anyway."""
    write_atomic(path, json.dumps(state, sort_keys=True).encode(), mode=0o644,
                 exact_mode=False, durable=False)
