"""What the pod's interface is given, and the checks it passes before anything changes.

One ``InterfaceConfig`` per moved interface, decoded from the claim's ``netdev:`` config
(``agent.claim.opaque``) and again, from the JSON the agent wrote into the CDI spec, by the
hook (``agent.netdev.hook``): both run the same checks, so the hook never acts on input the
claim would have refused.

The checks keep the configuration inside the pod. An address needs its prefix written out and
is never the host's business (unspecified, loopback, multicast, IPv6 link-local, an IPv4
subnet's network or broadcast address); a /0 address would make every destination on-link and
take over the pod's routing. A route always leaves through this interface, to a gateway on one
of its own subnets (a next hop reachable only through another interface would route through
the pod's CNI network, or nowhere), so a route never names anything outside the pod. The MTU
is within what IPv4 (68) and, with an IPv6 address, IPv6 (1280) need; the device's own maximum
is checked at prepare (``agent.prepare.effects.netdev``), where the host's interface is seen.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

# The hook imports this module at every container start: typing and dataclasses (inspect,
# ast) would be most of its import time, so neither is imported at run time; annotations
# stay strings (PEP 563) and mypy reads the block below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_ADDRESSES = 16
MAX_ROUTES = 32
MTU_MIN_V4, MTU_MIN_V6, MTU_MAX = 68, 1280, 65535
#: ``rdma:`` values: ``exclusive`` moves the RDMA device into the pod's network namespace
#: (the kernel must be in exclusive netns mode).
RDMA_MODES = ("exclusive",)
#: The ethtool features a claim may switch (the kernel's netdev feature names, as
#: ``ethtool -K`` and ETHTOOL_MSG_FEATURES_SET name them): offloads that change how the
#: interface handles its own traffic, nothing that reaches other interfaces or the host.
FEATURES = (
    "rx-checksum", "tx-checksum-ip-generic", "tx-scatter-gather", "tx-tcp-segmentation",
    "tx-tcp6-segmentation", "tx-generic-segmentation", "rx-gro", "rx-lro", "rx-gro-hw",
)
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}", re.ASCII)
_FIELDS = ("addresses", "mtu", "hardwareAddress", "routes", "ethtool", "rdma")
_ROUTE_FIELDS = ("destination", "gateway", "default")


class NetconfError(ValueError):
    """A field of the interface config is not usable; ``field`` is its path under netdev."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Frozen:
    """An immutable value compared by its fields, as ``@dataclass(frozen=True)`` makes one."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, **fields: object) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, fields.get(name))

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


class Route(Frozen):
    """A route through the pod's interface; ``destination`` None: the pod's default route."""

    __slots__ = ("destination", "gateway")
    destination: IPNetwork | None
    gateway: IPAddress | None

    def __init__(self, destination: IPNetwork | None, gateway: IPAddress | None) -> None:
        super().__init__(destination=destination, gateway=gateway)

    @property
    def version(self) -> int:
        if self.destination is not None:
            return self.destination.version
        assert self.gateway is not None  # a default route has a gateway (decode_route)
        return self.gateway.version

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = ({"default": True} if self.destination is None
                               else {"destination": str(self.destination)})
        if self.gateway is not None:
            out["gateway"] = str(self.gateway)
        return out


class InterfaceConfig(Frozen):
    """What the pod's interface gets. ``None`` fields are "not set here"."""

    __slots__ = ("addresses", "features", "hardware_address", "mtu", "rdma", "routes")
    addresses: tuple[IPInterface, ...] | None
    mtu: int | None
    hardware_address: str | None
    routes: tuple[Route, ...] | None
    features: Mapping[str, bool] | None
    rdma: str | None

    def __init__(self, *, addresses: tuple[IPInterface, ...] | None = None,
                 mtu: int | None = None, hardware_address: str | None = None,
                 routes: tuple[Route, ...] | None = None,
                 features: Mapping[str, bool] | None = None, rdma: str | None = None) -> None:
        super().__init__(addresses=addresses, mtu=mtu, hardware_address=hardware_address,
                         routes=routes, features=features, rdma=rdma)

    def __hash__(self) -> int:  # features is a dict
        return hash((self.addresses, self.mtu, self.hardware_address, self.routes, self.rdma))

    @property
    def is_set(self) -> bool:
        """Anything for the hook to do (the move alone is the runtime's)."""
        return any(v is not None for v in (self.addresses, self.mtu, self.hardware_address,
                                           self.routes, self.features, self.rdma))

    @property
    def rdma_exclusive(self) -> bool:
        return self.rdma == "exclusive"

    def merged(self, later: InterfaceConfig) -> InterfaceConfig:
        """``later``'s fields win where set (a class sets the MTU, a claim its addresses)."""
        if not later.is_set:
            return self
        fields = {name: getattr(later, name) if getattr(later, name) is not None
                  else getattr(self, name) for name in self.__slots__}
        return InterfaceConfig(**fields)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.addresses is not None:
            out["addresses"] = [str(a) for a in self.addresses]
        if self.mtu is not None:
            out["mtu"] = self.mtu
        if self.hardware_address is not None:
            out["hardwareAddress"] = self.hardware_address
        if self.routes is not None:
            out["routes"] = [r.to_json() for r in self.routes]
        if self.features is not None:
            out["ethtool"] = {"features": dict(self.features)}
        if self.rdma is not None:
            out["rdma"] = self.rdma
        return out


def decode(raw: Mapping[str, Any]) -> InterfaceConfig:
    """The interface fields of one ``netdev:`` config (other keys are the caller's); each
    field checked alone. ``check`` then checks them together, after configs are merged."""
    return InterfaceConfig(
        addresses=_addresses(raw["addresses"]) if raw.get("addresses") is not None else None,
        mtu=_mtu(raw["mtu"]) if raw.get("mtu") is not None else None,
        hardware_address=(_mac(raw["hardwareAddress"])
                          if raw.get("hardwareAddress") is not None else None),
        routes=_routes(raw["routes"]) if raw.get("routes") is not None else None,
        features=_ethtool(raw["ethtool"]) if raw.get("ethtool") is not None else None,
        rdma=_rdma(raw["rdma"]) if raw.get("rdma") is not None else None,
    )


def from_json(raw: Any) -> InterfaceConfig:
    """What ``to_json`` wrote, decoded and checked as a claim's config is (the hook's input)."""
    if not isinstance(raw, Mapping):
        raise NetconfError("netdev", "must be an object")
    unknown = sorted(str(k) for k in set(raw) - set(_FIELDS))
    if unknown:
        raise NetconfError(unknown[0], f"unknown field (known: {', '.join(_FIELDS)})")
    config = decode(raw)
    check(config)
    return config


def check(config: InterfaceConfig) -> None:
    """The checks across fields: MTU against the address families, routes against the
    addresses (a gateway on one of the interface's own subnets), one default per family."""
    addresses = config.addresses or ()
    if config.mtu is not None and config.mtu < MTU_MIN_V6 and any(
            a.version == 6 for a in addresses):
        raise NetconfError("mtu", f"{config.mtu} is below IPv6's minimum of {MTU_MIN_V6}, "
                                  "and the interface has an IPv6 address")
    defaults: set[int] = set()
    for i, route in enumerate(config.routes or ()):
        where = f"routes[{i}]"
        own = [a for a in addresses if a.version == route.version]
        if not own:
            raise NetconfError(where, f"an IPv{route.version} route needs an IPv"
                                      f"{route.version} address in addresses")
        if route.gateway is not None:
            if any(route.gateway == a.ip for a in own):
                raise NetconfError(f"{where}.gateway",
                                   f"{route.gateway} is the interface's own address")
            if not any(route.gateway in a.network for a in own):
                raise NetconfError(
                    f"{where}.gateway", f"{route.gateway} is on none of the interface's "
                    f"subnets ({', '.join(str(a.network) for a in own)}): a route must leave "
                    "through this interface to a next hop on its own link")
        if route.destination is None:
            if route.version in defaults:
                raise NetconfError(where, f"a second IPv{route.version} default route")
            defaults.add(route.version)


def _addresses(raw: Any) -> tuple[IPInterface, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_ADDRESSES:
        raise NetconfError("addresses", f"must be a list of at most {MAX_ADDRESSES} CIDRs")
    out: list[IPInterface] = []
    for i, entry in enumerate(raw):
        address = _address(entry, f"addresses[{i}]")
        if any(address.ip == seen.ip for seen in out):
            raise NetconfError(f"addresses[{i}]", f"{address.ip} is listed twice")
        out.append(address)
    return tuple(out)


def _address(entry: Any, where: str) -> IPInterface:
    if not isinstance(entry, str) or "/" not in entry:
        raise NetconfError(where, f"{entry!r:.60} is not an address with its prefix length "
                                  "(192.0.2.10/24, 2001:db8::10/64)")
    try:
        address = ipaddress.ip_interface(entry)
    except ValueError as err:
        raise NetconfError(where, f"{entry!r:.60} is not a CIDR address ({err})") from None
    ip, prefix = address.ip, address.network.prefixlen
    if prefix == 0:
        raise NetconfError(where, f"{entry} has prefix length 0: every destination would be "
                                  "on-link through this interface")
    why = ("unspecified" if ip.is_unspecified else "loopback" if ip.is_loopback
           else "multicast" if ip.is_multicast
           else "link-local (the kernel assigns IPv6 link-local addresses itself)"
           if ip.version == 6 and ip.is_link_local else None)
    if why is None and ip.version == 4 and prefix <= 30:
        if ip == address.network.network_address:
            why = f"the network address of {address.network}"
        elif ip == address.network.broadcast_address:
            why = f"the broadcast address of {address.network}"
    if why is not None:
        raise NetconfError(where, f"{entry} is {why}, not an address for an interface")
    return address


def _mtu(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not MTU_MIN_V4 <= raw <= MTU_MAX:
        raise NetconfError("mtu", f"{raw!r:.40} is not an MTU from {MTU_MIN_V4} to {MTU_MAX}")
    return raw


def _mac(raw: Any) -> str:
    if not isinstance(raw, str) or not _MAC.fullmatch(raw):
        raise NetconfError("hardwareAddress",
                           f"{raw!r:.40} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    mac = raw.lower()
    first = int(mac[:2], 16)
    if first & 1:
        raise NetconfError("hardwareAddress", f"{mac} is a multicast address")
    if mac == "00:00:00:00:00:00":
        raise NetconfError("hardwareAddress", "00:00:00:00:00:00 is not an address")
    return mac


def _routes(raw: Any) -> tuple[Route, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_ROUTES:
        raise NetconfError("routes", f"must be a list of at most {MAX_ROUTES} routes")
    out = tuple(_route(entry, f"routes[{i}]") for i, entry in enumerate(raw))
    for i, route in enumerate(out):
        if route.destination is not None and route.destination in (
                r.destination for r in out[:i]):
            raise NetconfError(f"routes[{i}]", f"{route.destination} is listed twice")
    return out


def _route(raw: Any, where: str) -> Route:
    if not isinstance(raw, Mapping):
        raise NetconfError(where, "must be an object with destination or default, and gateway")
    unknown = sorted(str(k) for k in set(raw) - set(_ROUTE_FIELDS))
    if unknown:
        raise NetconfError(f"{where}.{unknown[0]}",
                           f"unknown field (known: {', '.join(_ROUTE_FIELDS)})")
    default = raw.get("default", False)
    if not isinstance(default, bool):
        raise NetconfError(f"{where}.default", f"must be true or false, not {default!r:.40}")
    gateway = _gateway(raw.get("gateway"), f"{where}.gateway")
    if default:
        if raw.get("destination") is not None:
            raise NetconfError(where, "a default route has no destination")
        if gateway is None:
            raise NetconfError(f"{where}.gateway", "a default route needs a gateway")
        return Route(destination=None, gateway=gateway)
    destination = _destination(raw.get("destination"), f"{where}.destination")
    if gateway is not None and gateway.version != destination.version:
        raise NetconfError(f"{where}.gateway", f"{gateway} is not an IPv"
                                               f"{destination.version} address")
    return Route(destination=destination, gateway=gateway)


def _destination(raw: Any, where: str) -> IPNetwork:
    if not isinstance(raw, str) or "/" not in raw:
        raise NetconfError(where, f"{raw!r:.60} is not a network (10.0.0.0/8); the pod's "
                                  "default route is default: true")
    try:
        network = ipaddress.ip_network(raw)  # strict: no host bits set
    except ValueError as err:
        raise NetconfError(where, f"{raw!r:.60} is not a network ({err})") from None
    if network.prefixlen == 0:
        raise NetconfError(where, f"{raw} is every destination; say default: true")
    if network.is_multicast or network.is_loopback:
        raise NetconfError(where, f"{raw} is not a unicast destination")
    return network


def _gateway(raw: Any, where: str) -> IPAddress | None:
    if raw is None:
        return None
    try:
        gateway = ipaddress.ip_address(raw) if isinstance(raw, str) else None
    except ValueError:
        gateway = None
    if gateway is None or gateway.is_unspecified or gateway.is_multicast or gateway.is_loopback:
        raise NetconfError(where, f"{raw!r:.60} is not a unicast IP address")
    return gateway


def _ethtool(raw: Any) -> dict[str, bool]:
    if not isinstance(raw, Mapping) or set(raw) - {"features"}:
        raise NetconfError("ethtool", "must be an object with features only")
    features = raw.get("features")
    if not isinstance(features, Mapping) or not features:
        raise NetconfError("ethtool.features", "must map feature names to true or false")
    out: dict[str, bool] = {}
    for name, value in features.items():
        if name not in FEATURES:
            shown = name if isinstance(name, str) and name.isprintable() else ascii(name)
            raise NetconfError(f"ethtool.features.{shown}",
                               f"not a feature dra-agent sets (known: {', '.join(FEATURES)})")
        if not isinstance(value, bool):
            raise NetconfError(f"ethtool.features.{name}",
                               f"must be true or false, not {value!r:.40}")
        out[name] = value
    return out


def _rdma(raw: Any) -> str:
    if raw not in RDMA_MODES:
        raise NetconfError("rdma", f"{raw!r:.40} is not one of {', '.join(RDMA_MODES)}")
    return str(raw)
