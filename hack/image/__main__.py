"""python -m hack.image dockerfile | build [--out DIR] [--no-cache] | build --print-names"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hack.image.build import Builder, Built, image_names
from hack.image.cache import default_cache
from hack.image.dockerfile import render
from hack.image.errors import FAILED, BuildError
from hack.image.recipe import RECIPE, REPO, VERSION


def _say(message: str) -> None:
    print(f"hack.image: {message}", file=sys.stderr, flush=True)


def _report(built: Built) -> None:
    note = " (cached)" if built.cached else ""
    print(f"{built.name}  {built.path}  {built.size / 2**20:.1f} MiB  {built.seconds:.1f} s{note}",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.image", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("dockerfile", help="print the Dockerfile generated from the recipe")
    build = sub.add_parser("build", help="build the images as docker-archive tarballs (root)")
    build.add_argument("--out", type=Path, default=REPO / "build" / "images",
                       help="where the archives go (default: build/images)")
    build.add_argument("--cache", type=Path, default=None,
                       help="the cache (default: ${XDG_CACHE_HOME:-~/.cache}/dra-agent/image)")
    build.add_argument("--no-cache", action="store_true", help="re-do every step")
    build.add_argument("--print-names", action="store_true",
                       help="print the image names, one a line, and build nothing")
    args = parser.parse_args(argv)

    if args.command == "dockerfile":
        sys.stdout.write(render(RECIPE.agent, VERSION))
        return 0
    if args.print_names:
        print("\n".join(image_names()))
        return 0
    builder = Builder(
        args.out.absolute(), cache=(args.cache or default_cache()).absolute(),
        use_cache=not args.no_cache, say=_say,
    )
    try:
        builder.build(report=_report)
    except BuildError as exc:
        _say(str(exc))
        return exc.status
    except OSError as exc:
        # Disk full, a permission the build did not expect: still one line, no traceback.
        _say(f"build failed: {exc}")
        return FAILED
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
