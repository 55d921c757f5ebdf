"""``dra-agent run --simulate PROFILE`` on a node whose sysfs is already there, as a real
node's /sys is when the agent starts: the start-up bench's "node layout" rows.

``--simulate`` writes the profile's tree (about 1,500 files and directories) before discovery
reads it, a cost no real node pays. ``prepare(profile, workdir)`` writes the tree once, outside
any timing, with the simulated GPUs' description beside it; ``python -m hack.benches.nodestart
WORKDIR run ARGS...`` is then the agent's own command line (``agent.cli.main``) with one
substitution, where discovery reads: the tree in WORKDIR, through the same ``Sources`` that
``--simulate`` would have built over it (machine.sources is replaced before the daemon starts,
so the daemon, its imports and its order are the agent's).
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from pathlib import Path

GPUS = "gpus.pickle"


def prepare(profile: str, workdir: Path) -> None:
    """Write ``profile``'s tree under ``workdir`` and the description of its GPUs."""
    from discovery.simulate import simulated_sources

    sources = simulated_sources(profile, workdir)
    gpu = sources.gpu
    (workdir / GPUS).write_bytes(pickle.dumps((profile, gpu.gpus, gpu.driver)))  # type: ignore


def _sources(workdir: Path) -> object:
    from discovery.simulate.fake_nvml import FakeNvml
    from discovery.simulate.sriov import SimulatedSriov
    from discovery.sources import ProcRoutes, Sources

    profile, gpus, driver = pickle.loads((workdir / GPUS).read_bytes())
    return Sources(sysfs_root=workdir / "sys", gpu=FakeNvml(gpus, driver=driver),
                   dev_root=workdir / "dev", routes=ProcRoutes(workdir / "proc"),
                   proc_root=workdir / "proc", label=f"node layout {profile}",
                   sriov=SimulatedSriov(workdir / "sys"))


def main(argv: list[str]) -> None:
    workdir = Path(argv[0])
    from agent.daemon import machine

    def sources(_cfg: object, _cleanups: list[Callable[[], None]]) -> object:
        return _sources(workdir)

    machine.sources = sources  # type: ignore[assignment]
    sys.argv = ["dra-agent", *argv[1:]]
    from agent.cli import main as cli

    cli()


if __name__ == "__main__":
    main(sys.argv[1:])
