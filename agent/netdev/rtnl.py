"""rtnetlink requests for one interface: find it, set its MTU, hardware address and state,
add its addresses and routes (what ``ip link set``, ``ip addr add`` and ``ip route replace``
send; rtnetlink(7), include/uapi/linux/{rtnetlink,if_link,if_addr}.h).
"""

from __future__ import annotations

import socket
import struct

from agent.netdev.config import Frozen, IPInterface, Route
from agent.netdev.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NetlinkError,
    attr,
    attr_str,
    attr_text,
    attr_u32,
    parse_attrs,
)

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from agent.netdev.netlink import Transport

RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 18, 20, 24
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MIN_MTU, IFLA_MAX_MTU = 1, 3, 4, 50, 51
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
IFF_UP = 0x1
RT_TABLE_MAIN, RTPROT_STATIC, RTN_UNICAST = 254, 4, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
_IFINFO = struct.Struct("=BxHiII")  # struct ifinfomsg
_IFADDR = struct.Struct("=BBBBI")  # struct ifaddrmsg
_RTMSG = struct.Struct("=BBBBBBBBI")  # struct rtmsg


class Link(Frozen):
    """An interface as RTM_NEWLINK describes it (``address``: its MAC, lower case)."""

    __slots__ = ("address", "flags", "index", "max_mtu", "min_mtu", "mtu", "name")
    index: int
    name: str
    flags: int
    mtu: int | None
    min_mtu: int | None
    max_mtu: int | None
    address: str | None

    def __init__(self, *, index: int, name: str, flags: int, mtu: int | None,
                 min_mtu: int | None, max_mtu: int | None, address: str | None) -> None:
        super().__init__(index=index, name=name, flags=flags, mtu=mtu, min_mtu=min_mtu,
                         max_mtu=max_mtu, address=address)


def _family(version: int) -> int:
    return socket.AF_INET if version == 4 else socket.AF_INET6


def get_link(nl: Transport, name: str) -> Link:
    """The interface called ``name`` in this namespace; ENODEV when there is none."""
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr_str(IFLA_IFNAME, name)
    try:
        answers = nl.request(RTM_GETLINK, 0, body)
    except NetlinkError as err:
        raise NetlinkError(err.errno, f"interface {name}: {err.strerror}") from None
    for kind, payload in answers:
        if kind == RTM_NEWLINK:
            return decode_link(payload)
    raise NetlinkError(19, f"interface {name}: not found")


def decode_link(payload: bytes) -> Link:
    _, _, index, flags, _ = _IFINFO.unpack_from(payload)
    attrs = parse_attrs(payload, _IFINFO.size)

    def u32(key: int) -> int | None:
        raw = attrs.get(key)
        return struct.unpack("=I", raw[:4])[0] if raw and len(raw) >= 4 else None

    mac = attrs.get(IFLA_ADDRESS)
    return Link(index=index, name=attr_text(attrs.get(IFLA_IFNAME)) or "", flags=flags,
                mtu=u32(IFLA_MTU), min_mtu=u32(IFLA_MIN_MTU), max_mtu=u32(IFLA_MAX_MTU),
                address=":".join(f"{b:02x}" for b in mac) if mac else None)


def link_message(index: int, *, mtu: int | None = None, mac: str | None = None,
                 up: bool | None = None) -> bytes:
    """RTM_NEWLINK's body changing only what is given (``change`` masks the flags)."""
    flags = IFF_UP if up else 0
    change = IFF_UP if up is not None else 0
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, change)
    if mtu is not None:
        body += attr_u32(IFLA_MTU, mtu)
    if mac is not None:
        body += attr(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", "")))
    return body


def set_link(nl: Transport, index: int, *, mtu: int | None = None, mac: str | None = None,
             up: bool | None = None) -> None:
    nl.request(RTM_NEWLINK, NLM_F_ACK, link_message(index, mtu=mtu, mac=mac, up=up))


def address_message(index: int, address: IPInterface) -> bytes:
    """RTM_NEWADDR's body: ``ip addr add ADDRESS dev INDEX`` (local = address, no peer)."""
    packed = address.ip.packed
    return (_IFADDR.pack(_family(address.version), address.network.prefixlen, 0,
                         RT_SCOPE_UNIVERSE, index)
            + attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed))


def add_address(nl: Transport, index: int, address: IPInterface) -> bool:
    """Add it; False when the interface has it already (a second container of the pod)."""
    try:
        nl.request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                   address_message(index, address))
    except NetlinkError as err:
        if err.errno == 17:  # EEXIST
            return False
        raise
    return True


def route_message(index: int, route: Route) -> bytes:
    """RTM_NEWROUTE's body: a main-table route out of ``index`` (via the gateway, or on-link)."""
    family = _family(route.version)
    dst_len = route.destination.prefixlen if route.destination is not None else 0
    scope = RT_SCOPE_UNIVERSE if route.gateway is not None else RT_SCOPE_LINK
    body = _RTMSG.pack(family, dst_len, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, scope,
                       RTN_UNICAST, 0)
    if route.destination is not None:
        body += attr(RTA_DST, route.destination.network_address.packed)
    if route.gateway is not None:
        body += attr(RTA_GATEWAY, route.gateway.packed)
    return body + attr_u32(RTA_OIF, index)


def replace_route(nl: Transport, index: int, route: Route) -> None:
    """``ip route replace``: a default route takes the place of the pod's (its CNI's), and a
    second container of the pod sets the same route again without an error."""
    nl.request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
               route_message(index, route))
