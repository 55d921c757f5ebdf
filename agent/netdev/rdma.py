"""RDMA devices and network namespaces over NETLINK_RDMA (what ``rdma system show`` and
``rdma dev set DEV netns NS`` send; include/uapi/rdma/rdma_netlink.h).

In the kernel's *exclusive* netns mode an RDMA device belongs to one network namespace, and
moving its netdev does not move it: RDMA_NLDEV_CMD_SET with RDMA_NLDEV_NET_NS_FD does, from
the namespace the device is in (it is invisible from any other, so giving it back means
asking from inside the pod's namespace; DRANET's issue 177 was asking from the host's). When
a namespace is destroyed the kernel moves its RDMA devices back to init_net itself
(``rdma_dev_exit_net`` in drivers/infiniband/core/device.c: "If the real device is in the NS
then move it back to init"), as it does physical netdevs.

RDMA netlink messages carry their attributes right after the netlink header (no family
header), and the message type is ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)``.
"""

from __future__ import annotations

import struct

from agent.netdev.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NetlinkError,
    attr_text,
    attr_u32,
    parse_attrs,
)

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from agent.netdev.netlink import Transport

RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET, RDMA_NLDEV_CMD_SET, RDMA_NLDEV_CMD_SYS_GET = 1, 2, 6
RDMA_NLDEV_ATTR_DEV_INDEX, RDMA_NLDEV_ATTR_DEV_NAME = 1, 2
RDMA_NLDEV_SYS_ATTR_NETNS_MODE, RDMA_NLDEV_NET_NS_FD = 66, 68


def nldev_type(command: int) -> int:
    """``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)``: ``(client << 10) + op``."""
    return (RDMA_NL_NLDEV << 10) + command


def netns_mode(nl: Transport) -> str:
    """``shared`` or ``exclusive``: the kernel's RDMA netns mode (ib_core netns_mode)."""
    for _, payload in nl.request(nldev_type(RDMA_NLDEV_CMD_SYS_GET), 0, b""):
        raw = parse_attrs(payload).get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
        if raw:
            return "shared" if raw[0] else "exclusive"
    raise NetlinkError(71, "RDMA system answer without its netns mode")  # EPROTO


def devices(nl: Transport) -> dict[str, int]:
    """The RDMA devices this namespace sees: name -> index."""
    out: dict[str, int] = {}
    for _, payload in nl.request(nldev_type(RDMA_NLDEV_CMD_GET), NLM_F_DUMP, b""):
        attrs = parse_attrs(payload)
        name, index = attr_text(attrs.get(RDMA_NLDEV_ATTR_DEV_NAME)), attrs.get(
            RDMA_NLDEV_ATTR_DEV_INDEX)
        if name and index and len(index) >= 4:
            out[name] = struct.unpack("=I", index[:4])[0]
    return out


def move_message(index: int, netns_fd: int) -> bytes:
    """RDMA_NLDEV_CMD_SET's attributes moving device ``index`` to the namespace of the fd."""
    return attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, index) + attr_u32(RDMA_NLDEV_NET_NS_FD,
                                                                 netns_fd)


def move_device(nl: Transport, name: str, netns_fd: int) -> None:
    """Move RDMA device ``name``, seen from ``nl``'s namespace, to the one ``netns_fd`` opens;
    ENODEV when this namespace does not see it."""
    index = devices(nl).get(name)
    if index is None:
        raise NetlinkError(19, f"RDMA device {name}: not in this network namespace")
    try:
        nl.request(nldev_type(RDMA_NLDEV_CMD_SET), NLM_F_ACK, move_message(index, netns_fd))
    except NetlinkError as err:
        why = err.strerror or str(err)
        if err.errno == 95:  # EOPNOTSUPP: nldev_set_doit in shared mode
            why += " (the kernel's RDMA netns mode is shared: rdma system set netns exclusive)"
        raise NetlinkError(err.errno, f"RDMA device {name}: moving it: {why}") from None
