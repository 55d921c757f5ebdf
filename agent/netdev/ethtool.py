"""Netdev features over ethtool's generic netlink family (what ``ethtool -K DEV NAME on|off``
sends; include/uapi/linux/ethtool_netlink.h, Documentation/networking/ethtool-netlink.rst).

The request names each feature in a verbose bitset without NOMASK, so only the named bits
change. The kernel accepts a request for a feature the device cannot change and leaves it as
it is, so the active set is read back and a feature that did not follow is an error.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from agent.netdev.netlink import (
    NLM_F_ACK,
    NetlinkError,
    attr,
    attr_str,
    attr_text,
    attr_u32,
    nested,
    parse_attrs,
)

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from agent.netdev.netlink import Transport

GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 16, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
ETHTOOL_GENL_NAME, ETHTOOL_GENL_VERSION = "ethtool", 1
ETHTOOL_MSG_FEATURES_GET, ETHTOOL_MSG_FEATURES_SET = 11, 12
ETHTOOL_A_FEATURES_HEADER, ETHTOOL_A_FEATURES_WANTED, ETHTOOL_A_FEATURES_ACTIVE = 1, 3, 4
ETHTOOL_A_HEADER_DEV_INDEX = 1
ETHTOOL_A_BITSET_NOMASK, ETHTOOL_A_BITSET_BITS, ETHTOOL_A_BITSET_BITS_BIT = 1, 3, 1
ETHTOOL_A_BITSET_BIT_NAME, ETHTOOL_A_BITSET_BIT_VALUE = 2, 3
_GENL = struct.Struct("=BBH")  # struct genlmsghdr


def family_id(nl: Transport, name: str = ETHTOOL_GENL_NAME) -> int:
    body = _GENL.pack(CTRL_CMD_GETFAMILY, 1, 0) + attr_str(CTRL_ATTR_FAMILY_NAME, name)
    for _, payload in nl.request(GENL_ID_CTRL, 0, body):
        raw = parse_attrs(payload, _GENL.size).get(CTRL_ATTR_FAMILY_ID)
        if raw:
            return int(struct.unpack("=H", raw[:2])[0])
    raise NetlinkError(2, f"no generic netlink family {name}")


def _header(index: int) -> bytes:
    return nested(ETHTOOL_A_FEATURES_HEADER, attr_u32(ETHTOOL_A_HEADER_DEV_INDEX, index))


def features_message(index: int, wanted: Mapping[str, bool]) -> bytes:
    """ETHTOOL_MSG_FEATURES_SET's body: each named feature on (VALUE flag) or off."""
    bits = b"".join(
        nested(ETHTOOL_A_BITSET_BITS_BIT, attr_str(ETHTOOL_A_BITSET_BIT_NAME, name),
               *([attr(ETHTOOL_A_BITSET_BIT_VALUE, b"")] if on else []))
        for name, on in wanted.items())
    return (_GENL.pack(ETHTOOL_MSG_FEATURES_SET, ETHTOOL_GENL_VERSION, 0) + _header(index)
            + nested(ETHTOOL_A_FEATURES_WANTED, nested(ETHTOOL_A_BITSET_BITS, bits)))


def active_features(nl: Transport, family: int, index: int) -> set[str]:
    """The names of the features active on the interface now."""
    body = _GENL.pack(ETHTOOL_MSG_FEATURES_GET, ETHTOOL_GENL_VERSION, 0) + _header(index)
    active: set[str] = set()
    for _, payload in nl.request(family, 0, body):
        bitset = parse_attrs(payload, _GENL.size).get(ETHTOOL_A_FEATURES_ACTIVE, b"")
        fields = parse_attrs(bitset)
        # A list (NOMASK) names only the bits that are set, without VALUE flags.
        listed = ETHTOOL_A_BITSET_NOMASK in fields
        bits = fields.get(ETHTOOL_A_BITSET_BITS, b"")
        offset = 0
        while offset + 4 <= len(bits):  # each BITS_BIT nest in turn (they share a type)
            length = struct.unpack_from("=H", bits, offset)[0]
            if length < 4:
                break
            bit = parse_attrs(bits[offset + 4:offset + length])
            name = attr_text(bit.get(ETHTOOL_A_BITSET_BIT_NAME))
            if name and (listed or ETHTOOL_A_BITSET_BIT_VALUE in bit):
                active.add(name)
            offset += (length + 3) & ~3
    return active


def set_features(nl: Transport, index: int, wanted: Mapping[str, bool]) -> None:
    """Switch the features; EOPNOTSUPP naming those the device keeps as they were."""
    family = family_id(nl)
    nl.request(family, NLM_F_ACK, features_message(index, wanted))
    active = active_features(nl, family, index)
    stuck = sorted(name for name, on in wanted.items() if (name in active) != on)
    if stuck:
        raise NetlinkError(95, "the device does not change ethtool feature(s) "
                               + ", ".join(f"{n} (still {'on' if n in active else 'off'})"
                                           for n in stuck))
