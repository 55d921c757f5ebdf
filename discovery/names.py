"""Device names: DNS labels, unique in the pool, stable across rescans and reboots.

The scheme (also in the README of ``dra-agent discover``):

* NVIDIA GPU: ``gpu-<minor>`` (the ``/dev/nvidia<minor>`` number, as the NVIDIA DRA driver
  names them, so claims and docs carry over). Minors follow PCI order and survive reboots.
* MIG device: ``gpu-<parent minor>-mig-<profile>-<placement start>``, e.g.
  ``gpu-0-mig-1g10gb-0``; a compute instance smaller than its GPU instance adds
  ``-ci<compute instance id>`` (``gpu-3-mig-1c3g40gb-0-ci1``). The placement, not the GPU
  instance id, is used because the driver picks GI ids at random on re-creation.
* Any other PCI device (AMD/Intel GPU, NIC, VF): ``<type>-<pci address>`` with ``:`` and ``.``
  turned into ``-`` (``nic-0000-18-00-0``); interface names are not used since udev and users
  rename them.
"""

from __future__ import annotations

import hashlib
import logging
import re

log = logging.getLogger("discovery.names")

#: Used with fullmatch: re.match with "$" also accepts a trailing "\n" ("gpu-0\n").
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_BAD = re.compile(r"[^a-z0-9-]+")


def is_dns_label(name: str) -> bool:
    return bool(DNS_LABEL_RE.fullmatch(name))


def sanitize(name: str, source: str = "") -> str:
    """Turn anything into a DNS label; logs when the name had to change.

    Long names keep a hash of the original so two different long inputs stay distinct.
    """
    if is_dns_label(name):
        return name
    out = _BAD.sub("-", name.lower())
    out = re.sub(r"-{2,}", "-", out).strip("-") or "device"
    if len(out) > 63:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        out = out[:54].rstrip("-") + "-" + digest
    log.info("device name sanitised", extra={"original": name, "device": out, "source": source})
    return out


def pci_name(kind: str, bdf: str) -> str:
    return sanitize(f"{kind}-{bdf.replace(':', '-').replace('.', '-')}", source=bdf)


def gpu_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_name(parent_minor: int, profile: str, start: int, ci: int | None = None) -> str:
    base = f"gpu-{parent_minor}-mig-{profile.replace('.', '').replace('+', '')}-{start}"
    if ci is not None:
        base += f"-ci{ci}"
    return sanitize(base, source=profile)


_HEX = re.compile(r"[0-9a-f]+")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key over the ``-``-separated parts of a name: hex-digit parts compare by value.

    That orders decimal indexes naturally (gpu-2 before gpu-10: a decimal string read as hex
    keeps its order) and PCI bus numbers correctly (nic-0000-4f-00-0 before nic-0000-9a-00-0).
    """
    return tuple(
        (0, int(part, 16)) if _HEX.fullmatch(part) else (1, part) for part in name.split("-")
    )
