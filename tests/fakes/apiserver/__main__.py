"""`python -m tests.fakes.apiserver --port N [--kubeconfig PATH]`: run the fake as a process."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .server import FakeAPIServer
from .validation import DEFAULT_FEATURE_GATES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.apiserver", description="Run the fake Kubernetes API server."
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for it here")
    parser.add_argument(
        "--served-versions",
        default="v1",
        help="comma-separated resource.k8s.io versions to serve (default v1)",
    )
    parser.add_argument(
        "--bookmark-interval",
        type=float,
        default=60.0,
        help="seconds between watch bookmarks (default 60, as a real server)",
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        help="comma-separated Name=true|false over the DRA gate defaults, e.g. "
        "DRAListTypeAttributes=true (off by default: list attributes are dropped)",
    )
    args = parser.parse_args(argv)
    versions = tuple(v.strip() for v in args.served_versions.split(",") if v.strip())
    gates = _gates(parser, args.feature_gates)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv = FakeAPIServer(
        versions, port=args.port, bookmark_interval=args.bookmark_interval, feature_gates=gates
    )
    srv.start()
    try:
        if args.kubeconfig:
            srv.write_kubeconfig(args.kubeconfig)
        print(srv.url, flush=True)
        stop.wait()
    finally:
        srv.stop()
    return 0


def _gates(parser: argparse.ArgumentParser, text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        if name not in DEFAULT_FEATURE_GATES or value.lower() not in ("true", "false"):
            parser.error(f"--feature-gates: {item!r} is not Name=true|false with Name one of "
                         f"{', '.join(sorted(DEFAULT_FEATURE_GATES))}")
        gates[name] = value.lower() == "true"
    return gates


if __name__ == "__main__":
    sys.exit(main())
