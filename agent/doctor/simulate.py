"""A healthy host root for ``--simulate PROFILE``: what a node that works looks like.

The profile's sysfs/procfs/dev trees come from ``discovery.simulate`` (the same generator
``discover --simulate`` reads); this adds what the doctor reads beside them: containerd 2.x
with CDI on, a kubelet configuration, the kubelet's directories with the agent's sockets, the
NVIDIA container toolkit in CDI mode and ib_core in exclusive mode. Generated at run time into
a scratch directory, so the tree always matches the profile and the checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

from agent.doctor.context import Options
from discovery.sources import Sources

CONTAINERD = """\
# containerd 2.x: config version 3, CDI on by default (said here anyway, as operators do).
version = 3
imports = ["conf.d/*.toml"]

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"""
CONTAINERD_DROP_IN = """\
version = 3

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
"""
KUBELET = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
featureGates:
  DRAResourceClaimDeviceStatus: true
"""
#: The package database of a kubeadm node (Debian/Ubuntu): where the versions are recorded.
DPKG = """\
Package: containerd.io
Status: install ok installed
Architecture: amd64
Version: 2.1.4-1

Package: kubelet
Status: install ok installed
Architecture: amd64
Version: 1.35.0-1.1

Package: nvidia-container-toolkit
Status: install ok installed
Architecture: amd64
Version: 1.17.8-1
"""
TOOLKIT = """\
accept-nvidia-visible-devices-envvar-when-unprivileged = false

[nvidia-container-runtime]
mode = "cdi"
"""


def _write(root: Path, host_path: str, text: str) -> None:
    path = root / host_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _socket(root: Path, host_path: str) -> None:
    """A unix socket file at ``host_path``: bound at a short name, then moved, because a deep
    path can pass the 108-byte AF_UNIX limit. Nothing listens; the checks look at the file."""
    path = root / host_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    short = root / f".s{os.getpid()}"
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        sock.bind(str(short))
    os.replace(short, path)


def healthy_host_root(profile: str, root: Path, options: Options) -> Sources:
    """Write a healthy node of ``profile`` under ``root`` and return discovery's Sources.

    Raises ``discovery.simulate.ProfileError`` for an unknown profile.
    """
    from discovery.simulate import simulated_sources

    sources = simulated_sources(profile, root)  # first: it refuses a non-empty directory
    # /var/run -> /run as on every systemd host: the checks must see through it.
    (root / "run").mkdir(exist_ok=True)
    (root / "var").mkdir(exist_ok=True)
    os.symlink("../run", root / "var" / "run")
    for directory in ("/etc/cdi", str(options.cdi_dir)):
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
    _write(root, "/var/lib/dpkg/status", DPKG)
    _write(root, "/etc/containerd/config.toml", CONTAINERD)
    _write(root, "/etc/containerd/conf.d/10-images.toml", CONTAINERD_DROP_IN)
    _socket(root, "/run/containerd/containerd.sock")
    kubelet = str(options.kubelet_dir)
    _write(root, f"{kubelet}/config.yaml", KUBELET)
    _socket(root, f"{kubelet}/plugins_registry/{options.driver_name}-reg.sock")
    _socket(root, f"{options.plugin_dir}/dra.sock")
    # The kubelet writes this file even when no device plugin ever registered.
    _write(root, f"{kubelet}/device-plugins/kubelet_internal_checkpoint",
           json.dumps({"Data": {"PodDeviceEntries": None, "RegisteredDevices": {}},
                       "Checksum": 0}))
    # Read only where NVIDIA GPUs are on the bus (the toolkit checks skip otherwise).
    _write(root, "/etc/nvidia-container-runtime/config.toml", TOOLKIT)
    _write(root, "/sys/module/ib_core/parameters/netns_mode", "N\n")
    return sources
