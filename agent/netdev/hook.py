"""The OCI ``createRuntime`` hook that configures a claim's interface inside the pod.

The claim's CDI spec names it for each device whose ``netdev:`` config sets anything beyond
the move (``agent.prepare.effects.netdev``). The runtime runs it on the host, in the runtime's
namespaces, after it moved the CDI ``netDevices`` into the container's network namespace
(runc: ``setupNetworkDevices`` runs before the createRuntime hooks) and before the
container's process starts; the OCI state arrives on stdin (``pid``, ``bundle``). It:

1. with ``rdma: exclusive``, records where the RDMA device goes (``--state``: the pod's
   network namespace as the runtime names it, and its inode), then moves the RDMA device
   there from the host's namespace (RDMA_NLDEV_CMD_SET), so the agent can give it back at
   unprepare even if this hook dies half-way;
2. enters the container's network namespace (``/proc/<pid>/ns/net``) and configures the
   interface (``agent.netdev.apply``).

Arguments (all from the agent, in the spec): ``--interface=NAME`` (its name in the pod),
``--config=JSON`` (``InterfaceConfig.to_json``, checked again here), ``--rdma-device=DEV``
and ``--state=FILE`` with ``rdma: exclusive``, ``--claim=UID`` for the messages. A failure is
one line on stderr and exit status 1: the runtime fails the container with it, so a pod
never starts with an interface half configured. It imports nothing beyond the standard
library and this package: it runs once per container start.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from agent.netdev.apply import configure
from agent.netdev.config import InterfaceConfig, NetconfError, from_json
from agent.netdev.netlink import (
    NETLINK_GENERIC,
    NETLINK_RDMA,
    NETLINK_ROUTE,
    Netlink,
    NetlinkError,
)

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from typing import Any

_ARGS = ("interface", "config", "rdma-device", "state", "claim")


class HookError(Exception):
    """What the runtime shows as the container's error."""


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in argv:
        key, eq, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not eq or key not in _ARGS:
            raise HookError(f"unknown argument {arg!r:.80} (known: --{'=, --'.join(_ARGS)}=)")
        out[key] = value
    if "interface" not in out or "config" not in out:
        raise HookError("--interface and --config are required")
    return out


def namespace_path(state: dict[str, Any], pid: int) -> str:
    """The container's network namespace as the runtime names it: the path its config joins
    (the pod sandbox's, e.g. /var/run/netns/cni-...), else the process's own."""
    bundle = state.get("bundle")
    if isinstance(bundle, str) and bundle:
        try:
            with open(os.path.join(bundle, "config.json"), "rb") as f:
                spec = json.load(f)
            for ns in spec.get("linux", {}).get("namespaces", []):
                if ns.get("type") == "network" and isinstance(ns.get("path"), str):
                    return str(ns["path"])
        except (OSError, ValueError, AttributeError):
            pass  # the pid's own path is still a name for it
    return f"/proc/{pid}/ns/net"


def write_state(path: str, record: dict[str, Any]) -> None:
    """Durably, before the RDMA device moves: the agent's give-back reads it."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def move_rdma(device: str, netns_fd: int) -> bool:
    """Move the RDMA device into the pod's namespace; False when the host no longer sees it
    (a second container of the pod: the first one moved it; checked from inside later)."""
    from agent.netdev import rdma

    with Netlink(NETLINK_RDMA) as nl:
        if device not in rdma.devices(nl):
            return False
        rdma.move_device(nl, device, netns_fd)
    return True


def run(args: dict[str, str], state: dict[str, Any]) -> list[str]:
    """Everything the hook does; what was done."""
    pid = state.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise HookError(f"the OCI state on stdin has no container pid ({pid!r:.40})")
    try:
        config: InterfaceConfig = from_json(json.loads(args["config"]))
    except (ValueError, NetconfError) as err:
        raise HookError(f"--config: {err}") from None
    interface = args["interface"]
    netns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    done: list[str] = []
    device = args.get("rdma-device")
    if config.rdma_exclusive:
        if not device or not args.get("state"):
            raise HookError("rdma: exclusive needs --rdma-device and --state")
        write_state(args["state"], {"rdmaDevice": device, "netns": namespace_path(state, pid),
                                    "inode": os.fstat(netns_fd).st_ino})
        if move_rdma(device, netns_fd):
            done.append(f"RDMA device {device} moved in")
    from agent.netdev.netns import setns

    setns(netns_fd)  # for good: this process has nothing left to do on the host
    os.close(netns_fd)
    if config.rdma_exclusive and not done:
        from agent.netdev import rdma

        with Netlink(NETLINK_RDMA) as nl:
            if device not in rdma.devices(nl):
                raise HookError(f"RDMA device {device} is neither on the host nor in the pod")
    with Netlink(NETLINK_ROUTE) as route:
        done += configure(route, interface, config, generic=lambda: Netlink(NETLINK_GENERIC))
    return done


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Named in every message, also when the other arguments are what is wrong.
    claim = next((a.partition("=")[2] for a in argv if a.startswith("--claim=")), "?")
    try:
        args = parse_args(argv)
        state = json.loads(sys.stdin.read() or "{}")
        if not isinstance(state, dict):
            raise HookError("the OCI state on stdin is not an object")
        run(args, state)
    except (HookError, NetlinkError, OSError, ValueError) as err:
        text = str(err)
        if isinstance(err, OSError) and err.strerror:
            text = err.strerror + (f": {err.filename}" if err.filename else "")
        print(f"dra-agent netdev hook (claim {claim}): {text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
