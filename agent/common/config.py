"""The agent's configuration: one frozen ``Config``, the same for every command.

Where its values come from is the command line's business: the flags and their ``DRA_AGENT_*``
variables are declared in agent/commands/options.py, the YAML file is read and every value
checked in agent/commands/configfile.py (precedence: flags > environment > config file >
built-in default). Config holds plain values (text, paths, numbers), so that every layer can
take it without importing discovery or click: what a value means to discovery (a sharing
mode, a VF rate) discovery parses (agent/inventory.py).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DRIVER = "dra-agent.io"
ALL_DEVICE_TYPES = ("gpu", "mig", "nic", "vf")
NUMA_NODE_FORMS = ("auto", "list", "scalar")  # agent/slices/listattrs.py: what each means
MIG_MODES = ("static", "dynamic")  # discovery/partitions.py: what dynamic publishes
VF_MODES = ("static", "dynamic")  # discovery/vfs.py
#: Under the plugin directory: the stand-in device nodes of ``--simulate-device-nodes``
#: (``cdi.simnodes``), and the inbox of ``dra-agent simulate fault`` (``agent.simfaults``).
SIMULATED_DEV_SUBDIR = "simulated-dev"
SIMULATED_FAULTS_SUBDIR = "simulated-faults"


@dataclass(frozen=True, slots=True)
class Config:
    driver_name: str = DEFAULT_DRIVER
    node_name: str = ""
    #: A kubeconfig path, "none" for no API server, or "" for in-cluster -> KUBECONFIG -> ~/.kube.
    kubeconfig: str = ""
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    sysfs_root: Path = Path("/sys")
    simulate: str | None = None
    #: With ``simulate``: stand-in device nodes (1:3) for the simulated devices, made under
    #: ``simulated_dev_dir`` for a real container runtime to inject (``cdi.simnodes``).
    simulate_device_nodes: bool = False
    metrics_address: str = "127.0.0.1:9464"
    log_format: str = "logfmt"
    verbosity: int = 0
    device_types: tuple[str, ...] = ALL_DEVICE_TYPES
    #: numaNode as an int list (1.37 DRAListTypeAttributes) or an int; auto asks the server.
    numa_node_attribute: str = "auto"
    #: Device types published shareable (``--sharing gpu=shares:4``), each in the canonical
    #: ``TYPE=MODE`` spelling discovery/sharing.py parses and prints.
    sharing: tuple[str, ...] = ()
    #: static: offer the MIG instances that exist; dynamic: every partition, made at prepare.
    mig: str = "static"
    #: static: offer the VFs that exist; dynamic: a PF without VFs offers them, made on use.
    vfs: str = "static"
    #: With vfs=dynamic: what each VF is guaranteed of its PF's link ("25G"), discovery/vfs.py.
    vf_bandwidth: str | None = None
    #: Every whole GPU also offered as its VFIO form, bound to vfio-pci for a VM at prepare
    #: (discovery/passthrough.py).
    gpu_passthrough: bool = False
    config_file: Path | None = None

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / self.driver_name

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def simulated_dev_dir(self) -> Path:
        """Where ``simulate_device_nodes`` makes the stand-ins: in the plugin directory, which
        the DaemonSet mounts from the host at the same path, so the runtime finds them."""
        return self.plugin_dir / SIMULATED_DEV_SUBDIR

    @property
    def simulated_faults_dir(self) -> Path:
        """The inbox of a ``--simulate`` agent, where ``dra-agent simulate fault`` leaves its
        requests (``agent.simfaults``): in the plugin directory, which the pod sees too."""
        return self.plugin_dir / SIMULATED_FAULTS_SUBDIR


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0].lower()
