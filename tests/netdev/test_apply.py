"""The interface configured through real netlink, in a namespace the test made (conftest),
and read back with ``ip -n``: what the hook does inside a pod, without a runtime."""

from __future__ import annotations

import os
import subprocess

import pytest

from agent.netdev.apply import configure
from agent.netdev.config import from_json
from agent.netdev.netlink import NETLINK_GENERIC, NETLINK_ROUTE, Netlink, NetlinkError
from agent.netdev.netns import run_in
from tests.netdev.conftest import Pod

FULL = {
    "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
    "mtu": 9000,
    "hardwareAddress": "02:aa:00:00:00:01",
    "routes": [
        {"destination": "198.51.100.0/24", "gateway": "192.0.2.1"},
        {"destination": "203.0.113.0/28"},
        {"default": True, "gateway": "192.0.2.254"},
        {"destination": "2001:db8:1::/48", "gateway": "2001:db8::1"},
    ],
    "ethtool": {"features": {"tx-checksum-ip-generic": False, "tx-scatter-gather": False}},
}


def apply_in(pod: Pod, raw: dict[str, object]) -> list[str]:
    config = from_json(raw)
    fd = os.open(pod.netns_path, os.O_RDONLY)
    try:
        def inside() -> list[str]:
            with Netlink(NETLINK_ROUTE) as route:
                return configure(route, pod.interface, config,
                                 generic=lambda: Netlink(NETLINK_GENERIC))
        return run_in(fd, inside)
    finally:
        os.close(fd)


def link(pod: Pod) -> dict[str, object]:
    [out] = pod.ip("-d", "link", "show", pod.interface)
    assert isinstance(out, dict)
    return out


def addresses(pod: Pod) -> set[str]:
    [out] = pod.ip("addr", "show", pod.interface)
    assert isinstance(out, dict)
    return {f"{a['local']}/{a['prefixlen']}" for a in out["addr_info"]
            if a.get("scope") == "global"}


def routes(pod: Pod, family: str) -> dict[str, str | None]:
    out = pod.ip(family, "route", "show", "dev", pod.interface)
    assert isinstance(out, list)
    return {r["dst"]: r.get("gateway") for r in out}


def test_every_field_lands_on_the_interface_in_the_namespace(pod: Pod) -> None:
    done = apply_in(pod, FULL)
    shown = link(pod)
    assert shown["mtu"] == 9000
    assert shown["address"] == "02:aa:00:00:00:01"
    assert "UP" in shown["flags"]
    assert addresses(pod) == {"192.0.2.10/24", "2001:db8::10/64"}
    assert routes(pod, "-4") == {
        "default": "192.0.2.254", "198.51.100.0/24": "192.0.2.1", "203.0.113.0/28": None,
        "192.0.2.0/24": None}
    assert routes(pod, "-6")["2001:db8:1::/48"] == "2001:db8::1"
    assert "ethtool features tx-checksum-ip-generic=off,tx-scatter-gather=off" in done
    # The peer namespace (the far end) saw nothing of it.
    peer = subprocess.run(["ip", "-n", pod.peer, "addr"], capture_output=True, text=True,
                          check=True).stdout
    assert "192.0.2.10" not in peer and "02:aa:00:00:00:01" not in peer
    print(pod.ip_text("addr", "show", pod.interface), pod.ip_text("route"),
          pod.ip_text("-6", "route"), sep="\n")


def test_a_second_run_changes_nothing_and_fails_nothing(pod: Pod) -> None:
    """A second container of the pod runs the hook again."""
    apply_in(pod, FULL)
    before = (link(pod)["address"], addresses(pod), routes(pod, "-4"), routes(pod, "-6"))
    apply_in(pod, FULL)
    assert (link(pod)["address"], addresses(pod), routes(pod, "-4"),
            routes(pod, "-6")) == before


def test_a_new_hardware_address_on_a_running_link(pod: Pod) -> None:
    apply_in(pod, {"addresses": ["192.0.2.10/24"]})
    assert "UP" in link(pod)["flags"]
    apply_in(pod, {"hardwareAddress": "02:bb:00:00:00:02"})
    assert link(pod)["address"] == "02:bb:00:00:00:02"
    assert "UP" in link(pod)["flags"]


def test_the_kernel_refusing_names_the_interface_and_the_step(pod: Pod) -> None:
    # IPv6 off on the interface: the kernel refuses the address our checks let through.
    subprocess.run(["ip", "netns", "exec", pod.name, "sysctl", "-qw",
                    f"net.ipv6.conf.{pod.interface}.disable_ipv6=1"], check=True)
    with pytest.raises(NetlinkError) as err:
        apply_in(pod, {"addresses": ["192.0.2.10/24", "2001:db8::10/64"]})
    assert err.value.strerror == (f"interface {pod.interface}: address 2001:db8::10/64: "
                                  "Permission denied")
    assert addresses(pod) == {"192.0.2.10/24"}  # the steps before it stand


def test_a_missing_interface_is_one_line(pod: Pod) -> None:
    config = from_json({"mtu": 1500})
    fd = os.open(pod.netns_path, os.O_RDONLY)
    try:
        with pytest.raises(NetlinkError) as err:
            run_in(fd, lambda: configure(Netlink(NETLINK_ROUTE), "net9", config))
    finally:
        os.close(fd)
    assert err.value.strerror == "interface net9: No such device"
