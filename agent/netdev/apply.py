"""The interface configured, in the namespace the given sockets were opened in: hardware
address and MTU (with the link down where a driver needs it), the link up, the addresses,
the routes, the ethtool features. Each step's failure names the interface and the step.

Every step may run again (a second container of the pod runs the hook too): an address
present already is kept, routes are replaced, the link set to what it is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from agent.netdev import ethtool, rtnl
from agent.netdev.config import InterfaceConfig
from agent.netdev.netlink import NetlinkError

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from agent.netdev.netlink import Transport


def configure(route: Transport, name: str, config: InterfaceConfig,
              generic: Callable[[], Transport] | None = None) -> list[str]:
    """Apply ``config`` to interface ``name``; what was done, one phrase a step. ``generic``
    opens the generic netlink socket ethtool needs (only when features are asked for)."""
    done: list[str] = []

    def step(what: str, call: Callable[[], object]) -> None:
        try:
            call()
        except NetlinkError as err:
            raise NetlinkError(err.errno, f"interface {name}: {what}: {err.strerror}") from None
        done.append(what)

    link = rtnl.get_link(route, name)
    mac = config.hardware_address
    if mac is not None and mac != link.address:
        if link.flags & rtnl.IFF_UP:  # most drivers refuse a new MAC on a running link
            step("link down", lambda: rtnl.set_link(route, link.index, up=False))
        step(f"hardware address {mac}", lambda: rtnl.set_link(route, link.index, mac=mac))
    mtu = config.mtu
    if mtu is not None and mtu != link.mtu:
        step(f"MTU {mtu}", lambda: rtnl.set_link(route, link.index, mtu=mtu))
    step("link up", lambda: rtnl.set_link(route, link.index, up=True))
    for address in config.addresses or ():
        step(f"address {address}", partial(rtnl.add_address, route, link.index, address))
    for r in config.routes or ():
        shown = f"default route via {r.gateway}" if r.destination is None else (
            f"route {r.destination}" + (f" via {r.gateway}" if r.gateway else ""))
        step(shown, partial(rtnl.replace_route, route, link.index, r))
    features = config.features
    if features:
        if generic is None:
            raise NetlinkError(95, f"interface {name}: no generic netlink for ethtool")
        nl = generic()
        step("ethtool features " + ",".join(f"{k}={'on' if v else 'off'}"
                                            for k, v in features.items()),
             lambda: ethtool.set_features(nl, link.index, features))
    return done
