"""``dra-agent run --simulate PROFILE`` on a node whose sysfs is already there, as a real
node's /sys is when the agent starts: the start-up bench's "node layout" rows.

``--simulate`` writes the profile's tree (about 1,500 files and directories) before discovery
reads it, a cost no real node pays. ``prepare(profile, workdir)`` writes the tree once, outside
any timing, with the simulated GPUs' description beside it; ``python -m hack.benches.nodestart
WORKDIR run ARGS...`` is then the agent's own command line (``agent.cli.main``) with one
substitution, where discovery reads: the tree in WORKDIR, through the same ``Sources`` that
``--simulate`` would have built over it (machine.sources is replaced as that module
loads, so the daemon, its imports and its order are the agent's). ``python hack/benches/nodestart.py
WORKDIR run ARGS...`` is the same without loading the benchmarks' package (``hack.benches``,
its ``statistics`` and dataclass): what the start loads is then the agent's alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import pickle
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

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


class _OnImport(importlib.abc.MetaPathFinder):
    """Replaces ``agent.daemon.machine.sources`` as that module is first executed, so that
    the command imports the daemon when and as it does on its own (not ahead of it, which
    would also load it before the command's start-up settings, its collector pause)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name != "agent.daemon.machine":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        assert spec is not None and spec.loader is not None
        loader, workdir = spec.loader, self.workdir

        class Loader(importlib.abc.Loader):
            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)

                def sources(_cfg: object, _cleanups: list[Callable[[], None]]) -> object:
                    return _sources(workdir)

                module.sources = sources

        spec.loader = Loader()
        return spec


def main(argv: list[str]) -> None:
    sys.meta_path.insert(0, _OnImport(Path(argv[0])))
    sys.argv = ["dra-agent", *argv[1:]]
    from agent.cli import main as cli

    cli()


if __name__ == "__main__":
    if __spec__ is None:  # run as a file: the repository, not this directory, on the path
        sys.path[0] = str(Path(__file__).resolve().parents[2])
    main(sys.argv[1:])
