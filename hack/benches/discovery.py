"""Discovery benchmarks: full discovery of the dgx-h100 profile and a rescan with no change.

Goals (issue 3): full discovery <= 50 ms median, no-change rescan <= 20 ms median. Also
printed, without goals: profile generation and the 130-device sriov-nic scan.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from discovery.hotplug import HotplugWatcher
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import scratch_dir, simulated_sources
from discovery.sources import Sources
from hack.benches import Figure, median_ms


class _NoEvents:
    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        return None



def _fresh(workdir: Path, profile: str) -> Callable[[], Sources]:
    """New Sources on an existing tree: what a restarted agent sees (nothing cached)."""
    base = simulated_sources(profile, workdir)

    def make() -> Sources:
        return Sources(base.sysfs_root, base.gpu, base.dev_root, base.routes, base.proc_root)

    return make


def run(quick: bool) -> list[Figure]:
    runs = 7 if quick else 31
    figures: list[Figure] = []
    with scratch_dir() as tmp:
        root = Path(tmp)
        gen = median_ms(lambda: simulated_sources("dgx-h100", root / "gen"), 3 if quick else 9)
        figures.append(Figure("simulated dgx-h100 profile generation, median", gen, "ms"))

        make = _fresh(root / "h100", "dgx-h100")
        options = DiscoveryOptions()
        full = median_ms(lambda: discover(make(), options), runs)
        figures.append(Figure("discovery dgx-h100 full, median", full, "ms", "<= 50 ms",
                              full <= 50))

        sources = make()
        watcher = HotplugWatcher(sources, options, lambda inv: None, _NoEvents(),
                                 initial=discover(sources, options))
        rescan = median_ms(lambda: watcher.rescan("bench"), runs)
        figures.append(Figure("discovery dgx-h100 rescan, no change, median", rescan, "ms",
                              "<= 20 ms", rescan <= 20))

        sriov = _fresh(root / "sriov", "sriov-nic")
        big = median_ms(lambda: discover(sriov(), options), max(3, runs // 3))
        figures.append(Figure("discovery sriov-nic full (130 devices), median", big, "ms"))
    return figures


if __name__ == "__main__":
    for figure in run(quick=False):
        print(figure.row())
