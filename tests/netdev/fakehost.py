"""A ``NetdevHost`` whose RDMA devices' namespaces live in a file, as the kernel keeps them
when the agent dies: what the tests of the netdev effect (and its contract case) probe."""

from __future__ import annotations

import json
from pathlib import Path

from agent.netdev.host import Moved
from agent.netdev.rtnl import Link


class RecordingNetdevHost:
    """``path`` holds {rdma device: the pod namespace it is in}; no file: all at home."""

    def __init__(self, path: Path, *, mode: str | None = "exclusive",
                 max_mtu: int = 9216) -> None:
        self.path, self.mode, self.max_mtu = path, mode, max_mtu

    @property
    def in_pods(self) -> dict[str, str]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def hook_moved(self, rdma_device: str, netns: str) -> None:
        """What the hook does in the pod's start: the device goes to the pod's namespace."""
        self.path.write_text(json.dumps({**self.in_pods, rdma_device: netns}))

    def link(self, name: str) -> Link | None:
        return Link(index=7, name=name, flags=0, mtu=1500, min_mtu=68, max_mtu=self.max_mtu,
                    address=None)

    def rdma_mode(self) -> str | None:
        return self.mode

    def give_back(self, moved: Moved) -> str:
        pods = self.in_pods
        if pods.get(moved.rdma_device) != moved.netns:
            return "not in the pod's namespace"
        del pods[moved.rdma_device]
        self.path.write_text(json.dumps(pods))
        return "moved back from the pod's namespace"
