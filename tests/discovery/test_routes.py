"""ProcRoutes: the default-route interfaces and interface addresses from procfs files."""

from __future__ import annotations

from pathlib import Path

from discovery.sources import ProcRoutes

ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
bond0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
bond0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
ens6f0\t0000100A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
"""
IPV6_ROUTE = (
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fe800000000000000000000000000001 00000400 00000002 00000000 00000003     eno1\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
)
IF_INET6 = (
    "fd000000000000000000000000000002 04 40 00 82     eno1\n"
    "00000000000000000000000000000001 01 80 10 80       lo\n"
)
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 10.16.0.0/16 2 0 2
        |-- 10.16.0.7
           /32 host LOCAL
     +-- 192.168.1.0/24 2 0 2
        |-- 192.168.1.20
           /32 host LOCAL
        |-- 192.168.1.255
           /32 link BROADCAST
"""


def _proc(tmp: Path) -> Path:
    (tmp / "net").mkdir(parents=True)
    for name, text in (("route", ROUTE), ("ipv6_route", IPV6_ROUTE), ("if_inet6", IF_INET6),
                       ("fib_trie", FIB_TRIE)):
        (tmp / "net" / name).write_text(text)
    return tmp


def test_default_route_interfaces_v4_and_v6(tmp_path: Path) -> None:
    routes = ProcRoutes(_proc(tmp_path))
    assert routes.default_route_interfaces() == frozenset({"bond0", "eno1"})


def test_interface_addresses_from_fib_trie_and_if_inet6(tmp_path: Path) -> None:
    addrs = ProcRoutes(_proc(tmp_path)).interface_addresses()
    assert addrs["bond0"] == frozenset({"192.168.1.20"})
    assert addrs["ens6f0"] == frozenset({"10.16.0.7"})
    assert addrs["eno1"] == frozenset({"fd00::2"})


def test_missing_procfs_means_no_routes(tmp_path: Path) -> None:
    routes = ProcRoutes(tmp_path / "absent")
    assert routes.default_route_interfaces() == frozenset()
    assert routes.interface_addresses() == {}
