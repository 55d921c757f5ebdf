"""What every check reads: the host root, the agent's options, discovery and the API client.

Discovery and the Node object are asked at most once per run (several checks need them), and
only when a check asks: a run whose API checks are all skipped never builds a request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from agent.doctor.host import HostRoot, one_line

if TYPE_CHECKING:
    from agent.kube.transport import Response
    from discovery.gpulib import GpuLibrary
    from discovery.model import Inventory

#: (connect, read) seconds of every doctor request: a stuck API server costs seconds, not minutes.
API_TIMEOUT = (3.0, 5.0)
DEFAULT_KUBELET_DIR = PurePosixPath("/var/lib/kubelet")
DEFAULT_CDI_DIR = PurePosixPath("/var/run/cdi")


class Http(Protocol):
    """The slice of ``agent.kube.transport.KubeHTTP`` the API checks use (tests pass a fake)."""

    @property
    def server(self) -> str: ...

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None,
                content_type: str = "application/json", timeout: Any = ...) -> Response: ...


@dataclass(frozen=True, slots=True)
class Options:
    """The agent's options that say where its files are (host paths)."""

    driver_name: str = "dra-agent.io"
    node_name: str = "node"
    kubelet_dir: PurePosixPath = DEFAULT_KUBELET_DIR
    cdi_dir: PurePosixPath = DEFAULT_CDI_DIR
    metrics_address: str = "127.0.0.1:9464"
    device_types: tuple[str, ...] = ("gpu", "mig", "nic", "vf")

    @property
    def plugin_dir(self) -> PurePosixPath:
        return self.kubelet_dir / "plugins" / self.driver_name


@dataclass
class Context:
    host: HostRoot
    options: Options = field(default_factory=Options)
    #: The API server, or None; then ``api_skip`` says why (one line).
    api: Http | None = None
    api_skip: str = "no API server configured (--kubeconfig none)"
    #: Credentials that were configured but cannot be used: the API server check warns with
    #: this line (the other API checks are skipped, pointing at it).
    api_error: str = ""
    #: Discovery of this node (the agent's own code); None: a test that needs none.
    discover: Callable[[], Inventory] | None = None
    #: The NVML seam (discovery.nvml.NvmlLibrary on a host, the fake on a simulated node).
    gpu: GpuLibrary | None = None
    #: Set on a simulated node: the checks of a running agent say so instead of failing.
    simulated: str = ""
    _inventory: Inventory | None = None
    _node: tuple[Mapping[str, Any] | None, str] | None = None
    _version: tuple[Mapping[str, Any] | None, str] | None = None
    _packages: dict[str, str] | None = None

    def inventory(self) -> Inventory:
        if self._inventory is None:
            from discovery.model import Inventory

            self._inventory = self.discover() if self.discover is not None else Inventory(())
        return self._inventory

    def packages(self) -> dict[str, str]:
        """Installed package -> version from the host's dpkg database ({} without one)."""
        if self._packages is None:
            from agent.doctor.packages import dpkg_versions

            self._packages = dpkg_versions(self.host)
        return self._packages

    def server_version(self) -> tuple[Mapping[str, Any] | None, str]:
        """The API server's /version, or (None, why). Asked once: when the server does not
        answer, every other API check says so at once instead of waiting out its own timeout
        (a black-holed server would cost a connect timeout per request)."""
        if self._version is None:
            self._version = self._read_version()
        return self._version

    def unreachable(self) -> str:
        """Why the API cannot be used ("" when it can): no client, or no answer."""
        if self.api is None:
            return self.api_skip or "no usable credentials (see API server)"
        return "the API server did not answer (see API server)" \
            if self.server_version()[0] is None else ""

    def _read_version(self) -> tuple[Mapping[str, Any] | None, str]:
        if self.api is None:
            return None, self.api_skip
        try:
            doc = self.api.request("GET", "/version", timeout=API_TIMEOUT).raise_for_status() \
                .json()
        except Exception as err:  # no answer, an error status, a body that is not JSON
            return None, one_line(str(err))
        return (doc, "") if isinstance(doc, dict) else (None, "/version is not a JSON object")

    def node(self) -> tuple[Mapping[str, Any] | None, str]:
        """This node's Node object, or (None, why) when it cannot be read."""
        if self._node is None:
            self._node = self._read_node()
        return self._node

    def _read_node(self) -> tuple[Mapping[str, Any] | None, str]:
        if self.api is None or self.unreachable():
            return None, self.unreachable()
        from urllib.parse import quote

        path = f"/api/v1/nodes/{quote(self.options.node_name, safe='')}"
        try:
            resp = self.api.request("GET", path, timeout=API_TIMEOUT)
            if resp.status == 404:
                return None, f"Node {self.options.node_name!r} not found (is --node-name right?)"
            doc = resp.raise_for_status().json()
        except Exception as err:  # any failure is this check's answer, not the run's
            return None, f"cannot read Node {self.options.node_name}: {one_line(str(err))}"
        return (doc, "") if isinstance(doc, dict) else (None, "the Node is not a JSON object")
