"""Run every benchmark and print one table: ``python -m hack.bench [--quick] [AREA ...]``.

Each area lives in ``hack/benches/<area>.py`` and returns ``Figure`` rows with their goals.
Without areas, every one of ``AREAS`` runs (within 10 minutes on a 2-CPU machine); ``fleet``
(most of an hour) and ``grpcpath`` (about 100 s of information rows, the gRPC server's variants
behind docs/durability.md's choice) run only when named.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

from hack.benches import Figure

AREAS = (
    "discovery", "partitions", "cdi", "plugin", "sharing", "flood", "slices", "startup",
    "explain", "instructions", "syscalls", "health", "ops", "e2e", "realkubelet",
    "vs-upstream", "netdev",
)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("areas", nargs="*", default=list(AREAS))
    parser.add_argument("--quick", action="store_true", help="shorter windows and fewer rounds")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    print(f"{'figure':<58} {'value':>10} {'unit':<10} {'goal':<14} verdict")
    failed = False
    for area in args.areas:
        start = time.monotonic()
        try:
            module = importlib.import_module(f"hack.benches.{area.replace('-', '')}")
        except ModuleNotFoundError as err:
            print(f"# {area}: not available ({err})")
            continue
        figures: list[Figure] = module.run(args.quick)
        for fig in figures:
            print(fig.row())
            failed |= fig.ok is False
        print(f"# {area}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
