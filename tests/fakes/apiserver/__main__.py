"""`python -m tests.fakes.apiserver --port N [--kubeconfig PATH]`: run the fake as a process."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from .server import FakeAPIServer
from .validation import DEFAULT_FEATURE_GATES

#: How long stopping may take before the process exits without its handler threads.
STOP_GRACE_S = 5.0


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
        # A handler thread still reading a client's connection (one accepted as the server
        # stopped, before its cut) would keep stop() joining it for ever, and the script that
        # started this process waits on it (hack/playground.sh after a Ctrl-C): the process
        # ends within STOP_GRACE_S whatever its threads do.
        stopping = threading.Thread(target=srv.stop, name="fake-apiserver-stop", daemon=True)
        stopping.start()
        stopping.join(STOP_GRACE_S)
        if stopping.is_alive():
            print(f"fake API server: handler threads still running after {STOP_GRACE_S:g} s; "
                  "exiting without them", file=sys.stderr, flush=True)
            os._exit(0)  # the interpreter's exit would join those (non-daemon) threads
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
