"""Which GPUs of this node share NVLink, from NVML's per-link state and the GPU fabric info.

No driver publishes this (NVIDIA's DRA driver issues 214 and 174), so a claim for 2 or 4
GPUs cannot ask for GPUs that reach each other over NVLink. We publish two attributes on
every whole GPU that has an NVLink peer:

- ``nvlinkDomain``: the same string on every GPU of one NVLink-connected group and a
  different one on every other group, which is exactly what ``matchAttribute`` needs. A GPU
  registered in a multi-node NVLink fabric (GB200 NVL72: state completed, status success, a
  cluster UUID that is not zero) gets its clique, ``<cluster UUID>.<clique id>`` (47
  characters at most; the form NVIDIA's GPU feature discovery labels ``nvidia.com/gpu.clique``
  with). Any other GPU gets the group that its active links make on this node: GPUs joined
  directly (bridged pairs of a PCIe server) or through a shared NVSwitch (HGX: all 8), named
  after the lowest PCI address among them, so the value depends on the wiring only and stays
  the same across reboots and rescans.
- ``nvlinkClique``: the clique alone, on fabric-attached GPUs, for selectors across nodes.

A GPU without NVLink (NOT_SUPPORTED, or a driver without the call) or with no active link
gets neither, with no warning; neither does a GPU left alone in its group (a bridge to a GPU
that is not scanned, in MIG mode or passed to a VM). A link read that fails in another way
is one warning for the GPU, which then joins no group, so a half-read GPU never bridges two
groups that are not joined.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from discovery.gpulib import (
    NVLINK_MAX_LINKS,
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_SWITCH,
    NVLINK_REMOTE_UNKNOWN,
    DeviceHandle,
    FabricInfo,
    GpuLibrary,
    GpuLibraryError,
    InvalidArgumentError,
    NotSupportedError,
    nvml_bus_id_to_sysfs,
)
from discovery.model import AttributeValue

DOMAIN = "nvlinkDomain"
CLIQUE = "nvlinkClique"
#: A remote PCI address NVML gives for an endpoint that is no PCI function of this node.
_NO_ADDRESS = "0000:00:00.0"


@dataclass(frozen=True, slots=True)
class GpuLinks:
    """What one GPU's links reach: the PCI addresses (sysfs form) at the far end of its
    active links, by what NVML says is there (a GPU, an NVSwitch, or a driver too old to
    say), and its fabric info."""

    bdf: str
    gpus: frozenset[str]
    switches: frozenset[str]
    unknown: frozenset[str] = frozenset()
    fabric: FabricInfo | None = None

    @property
    def clique(self) -> str | None:
        if self.fabric is None or not self.fabric.attached:
            return None
        return f"{self.fabric.cluster_uuid}.{self.fabric.clique_id}"


def read_links(lib: GpuLibrary, handle: DeviceHandle, bdf: str, name: str,
               warnings: list[str]) -> GpuLinks | None:
    """One GPU's active links and fabric info; None (and one warning) when a read failed."""
    ends: dict[int, set[str]] = {NVLINK_REMOTE_GPU: set(), NVLINK_REMOTE_SWITCH: set(),
                                 NVLINK_REMOTE_UNKNOWN: set()}
    for link in range(NVLINK_MAX_LINKS):
        try:
            if not lib.device_nvlink_state(handle, link):
                continue
            remote = _remote_address(lib, handle, link)
            kind = _remote_type(lib, handle, link)
        except NotSupportedError:
            if link == 0:
                break  # no NVLink on this GPU (or this driver): nothing to say
            continue
        except InvalidArgumentError:
            continue  # a link index this GPU does not have
        except (GpuLibraryError, ValueError) as err:
            warnings.append(f"{name}: NVLink {link} unreadable, GPU left out of NVLink "
                            f"domains: {err}")
            return None
        if remote is None or remote == bdf or kind not in ends:
            continue  # no address, a loopback, or a POWER9 CPU (IBMNPU): no GPU peer
        ends[kind].add(remote)
    return GpuLinks(bdf, frozenset(ends[NVLINK_REMOTE_GPU]),
                    frozenset(ends[NVLINK_REMOTE_SWITCH]),
                    frozenset(ends[NVLINK_REMOTE_UNKNOWN]),
                    _fabric(lib, handle, name, warnings))


def _remote_address(lib: GpuLibrary, handle: DeviceHandle, link: int) -> str | None:
    try:
        remote = nvml_bus_id_to_sysfs(lib.device_nvlink_remote_pci_bus_id(handle, link))
    except NotSupportedError:
        return None  # an NVSwitch outside this node (GB200): the fabric info says the rest
    return None if remote == _NO_ADDRESS else remote


def _remote_type(lib: GpuLibrary, handle: DeviceHandle, link: int) -> int:
    try:
        return lib.device_nvlink_remote_device_type(handle, link)
    except NotSupportedError:
        return NVLINK_REMOTE_UNKNOWN  # a driver before the call: the address decides


def _fabric(lib: GpuLibrary, handle: DeviceHandle, name: str,
            warnings: list[str]) -> FabricInfo | None:
    try:
        return lib.device_gpu_fabric_info(handle)
    except NotSupportedError:
        return None  # before Hopper, or a driver without the call
    except GpuLibraryError as err:
        warnings.append(f"{name}: GPU fabric info unreadable, no NVLink clique: {err}")
        return None


def nvlink_attributes(links: Iterable[GpuLinks], node_gpus: Collection[str] = ()
                      ) -> dict[str, dict[str, AttributeValue]]:
    """GPU PCI address -> its NVLink attributes (only GPUs that have any). Pure.

    ``node_gpus``: the PCI addresses of every NVIDIA GPU of the node, also those whose links
    were not read, so that an endpoint of unknown type is taken for a switch only when it is
    no GPU."""
    links = list(links)
    gpus = {g.bdf for g in links} | set(node_gpus)
    out: dict[str, dict[str, AttributeValue]] = {}
    local = []
    for g in links:
        clique = g.clique
        if clique is not None:
            out[g.bdf] = {DOMAIN: clique, CLIQUE: clique}
        else:
            local.append(g)
    for group in _groups(local, gpus):
        if len(group) > 1:
            name = min(group)
            for bdf in group:
                out[bdf] = {DOMAIN: name}
    return out


def _groups(gpus: list[GpuLinks], node_gpus: Collection[str]) -> list[set[str]]:
    """Connected components of the GPUs given: an edge for a link from either side to the
    other (both must be given), and between every two GPUs linked to the same switch. An
    endpoint of unknown type is a GPU when it is one of ``node_gpus``, else a switch."""
    parent = {g.bdf: g.bdf for g in gpus}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    by_switch: dict[str, str] = {}
    for g in gpus:
        peers = g.gpus | {e for e in g.unknown if e in node_gpus}
        for peer in peers:
            if peer in parent:
                join(g.bdf, peer)
        for switch in g.switches | (g.unknown - peers):
            _share(by_switch, switch, g.bdf, join)
    groups: dict[str, set[str]] = {}
    for bdf in parent:
        groups.setdefault(root(bdf), set()).add(bdf)
    return sorted(groups.values(), key=min)


def _share(by_switch: dict[str, str], switch: str, bdf: str,
           join: Callable[[str, str], None]) -> None:
    first = by_switch.setdefault(switch, bdf)
    if first != bdf:
        join(first, bdf)
