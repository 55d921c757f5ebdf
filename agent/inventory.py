"""This node's devices under a Config, and the ResourceSlices they would make.

One place, so that ``run`` and its rescans, ``discover``, ``doctor`` and ``explain --slices
from-discovery`` never offer different devices: discovery's options come from the Config here
alone (Config holds text, discovery parses it), and a preview of the slices is rendered by the
slice controller's own code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.common.config import Config
from discovery.model import DriverResources, Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.vfs import parse_vf_rate


def discovery_options(cfg: Config, **more: Any) -> DiscoveryOptions:
    """What discovery offers under ``cfg`` (``more``: what only a running agent knows, its
    node addresses and the MIG instances it made)."""
    return DiscoveryOptions(
        device_types=cfg.device_types, sharing=parse_sharing_list(cfg.sharing), mig=cfg.mig,
        vfs=cfg.vfs, vf_bandwidth_mbps=parse_vf_rate(cfg.vf_bandwidth) if cfg.vf_bandwidth
        else None, gpu_passthrough=cfg.gpu_passthrough, **more)


def run_discovery(cfg: Config) -> Inventory:
    """Discover once with the configured sources (a throw-away tree for ``--simulate``).

    Raises ``discovery.simulate.ProfileError`` for an unknown profile.
    """
    options = discovery_options(cfg)
    if not cfg.simulate:
        # Lazy, as the simulator below: a node loads only the sources it reads (NVML, udev).
        from discovery.host import host_sources

        return discover(host_sources(sysfs_root=cfg.sysfs_root), options)
    from discovery.simulate import scratch_dir, simulated_sources

    with scratch_dir() as tmp:
        return discover(simulated_sources(cfg.simulate, Path(tmp)), options)


def slice_objects(
    resources: DriverResources, driver: str, node_name: str
) -> list[dict[str, Any]]:
    """ResourceSlice dicts exactly as the slice controller would create them for this node.

    The API server appends the random suffix to ``generateName``, so no ``name`` exists yet;
    the Node owner reference is left out because its UID needs the API server.
    """
    # Lazy: the controller's package is a fifth of a second to import, and only a printed or
    # explained preview needs it (``discover``'s table does not).
    from agent.slices import Owner
    from agent.slices.render import render_slices

    objects = render_slices(driver, Owner(name=node_name), resources)
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)
    return objects
