"""ResourceSlice names: the ``<index>-<driver>-<owner>-`` generateName prefix and its decoding.

The index of a slice in ``Pool.slices`` leads the name, as the upstream controller (v0.36+)
does: the scheduler sorts slices by name and allocates first-fit, so the driver's order is the
allocation priority, and a restarted agent can match existing slices to desired ones by name
alone. The driver name keeps its dots: a ResourceSlice name is a DNS subdomain, so
``00000-dra-agent.io-node1-x7k2p`` is valid, and it is the name upstream drivers produce.
"""

from __future__ import annotations

#: Shortest index prefix; wider only when a pool has more than 0xfffff slices.
MIN_INDEX_WIDTH = 5
#: The API server keeps this much of a generateName before adding 5 random characters.
GENERATE_NAME_KEEP = 58
SEPARATOR = "-"


def index_width(slice_count: int) -> int:
    """Hex digits needed for the highest index of a pool with ``slice_count`` slices."""
    highest = max(slice_count - 1, 0)
    return max(MIN_INDEX_WIDTH, len(f"{highest:x}"))


def encode_index(index: int, width: int) -> str:
    if index < 0:
        raise ValueError(f"slice index must be >= 0, not {index}")
    return f"{index:0{width}x}"


def decode_index(name: str, width: int) -> int | None:
    """The index a slice name starts with, or None when the name does not carry one.

    The separator must sit exactly at ``width``: a slice written when the pool needed a wider
    prefix (or by the pre-1.36 naming scheme, ``<node>-<driver>-``) is then not matched and
    gets replaced, which keeps lexicographic order equal to index order.
    """
    if name.find(SEPARATOR) != width:
        return None
    prefix = name[:width]
    if not all(c in "0123456789abcdef" for c in prefix):
        return None
    return int(prefix, 16)


def generate_name(index: int, width: int, driver: str, owner_name: str | None) -> str:
    """``<index>-<driver>-[<owner>-]`` as sent in ``metadata.generateName``.

    The driver is lowercased because a ResourceSlice name must be lowercase while the API
    accepts a driver name with capitals (it only warns). The server truncates the prefix to
    58 characters; truncation only drops trailing parts, so the index survives and the
    result stays a valid DNS subdomain (no part is empty: driver and node names are
    subdomains themselves).
    """
    parts = [encode_index(index, width), driver.lower()]
    if owner_name:
        parts.append(owner_name)
    return SEPARATOR.join(parts) + SEPARATOR
