"""The agent's slice controller (agent/slices) alone, driven like ``peer-slices``.

    python -m hack.benches.publisher --kubeconfig K --node-name N [--driver-name D]

The counterpart of ``hack/realk8s/bin/1.37/peer-slices`` (the upstream resourceslice
controller) for the vs-upstream benchmark's publish rows: the same stdin protocol, so both
publishers are driven alike. It starts the controller with the daemon's timing and an empty
pool set for the Node, waits until that is in sync and prints "ready". Each stdin line is then
a path to a JSON list of v1 devices, published as the node's one pool split by
``chunk_devices`` (128 a slice), answered with "updated"; an empty list removes the pool. Its
own process, as the daemon is: in the benchmark's process the watch observer would compete
with the controller for the GIL.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--driver-name", default="dra-agent.io")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    from agent.kube.client import api_client
    from agent.slices import Owner, chunk_devices, start
    from discovery.model import DriverResources, Pool

    client = api_client(args.kubeconfig)
    if client is None:
        print(f"publisher: no API client from {args.kubeconfig}", file=sys.stderr)
        return 1
    controller = start(client, args.driver_name, Owner(kind="Node", name=args.node_name),
                       DriverResources({}))
    try:
        if not controller.synced(60):
            print("publisher: the empty pool set was not in sync after 60 s", file=sys.stderr)
            return 1
        print("ready", flush=True)
        for line in sys.stdin:
            path = line.strip()
            if not path:
                continue
            devices = json.loads(Path(path).read_text())
            pools = {args.node_name: Pool(chunk_devices(devices))} if devices else {}
            controller.update(DriverResources(pools))
            print("updated", flush=True)
    finally:
        controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
