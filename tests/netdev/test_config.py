"""The ``netdev:`` opaque config's interface fields: accepted, merged, and every bad input
refused in one line naming the field, before anything changes (``merge_configs`` is what
prepare calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.claim.opaque import ConfigDecodeError, merge_configs
from agent.netdev.config import from_json


def config(**netdev: Any) -> dict[str, Any]:
    return {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "netdev": netdev}


def test_every_field_decodes_and_goes_to_the_hook_unchanged() -> None:
    merged = merge_configs([config(
        move=True, interfaceName="net1", addresses=["192.0.2.10/24", "2001:db8::10/64"],
        mtu=9000, hardwareAddress="02:AA:00:00:00:01",
        routes=[{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"},
                {"default": True, "gateway": "2001:db8::1"}],
        ethtool={"features": {"rx-gro": False}}, rdma="exclusive")])
    interface = merged.netdev.interface
    assert interface.to_json() == {
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"], "mtu": 9000,
        "hardwareAddress": "02:aa:00:00:00:01",
        "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"},
                   {"default": True, "gateway": "2001:db8::1"}],
        "ethtool": {"features": {"rx-gro": False}}, "rdma": "exclusive"}
    assert from_json(interface.to_json()) == interface
    assert interface.rdma_exclusive and merged.pod_interface_name == "net1"


def test_a_class_sets_the_mtu_and_a_claim_the_addresses() -> None:
    merged = merge_configs([config(addresses=["192.0.2.10/24"])],
                           class_params=[config(move=True, mtu=9000)])
    assert (merged.netdev.interface.mtu, [str(a) for a in merged.netdev.interface.addresses
                                          or ()]) == (9000, ["192.0.2.10/24"])


def test_the_checks_across_fields_run_on_the_merged_config() -> None:
    """The class's MTU is fine alone, the claim's IPv6 address too; together they are not."""
    with pytest.raises(ConfigDecodeError, match="below IPv6's minimum of 1280"):
        merge_configs([config(addresses=["2001:db8::2/64"])],
                      class_params=[config(move=True, mtu=1000)])


BAD = [
    (dict(addresses=["192.0.2.10"]), "netdev.addresses[0]", "with its prefix length"),
    (dict(addresses=["192.0.2.300/24"]), "netdev.addresses[0]", "not a CIDR address"),
    (dict(addresses=["192.0.2.10/33"]), "netdev.addresses[0]", "not a CIDR address"),
    (dict(addresses=["2001:db8::1/129"]), "netdev.addresses[0]", "not a CIDR address"),
    (dict(addresses=["192.0.2.10/0"]), "netdev.addresses[0]", "prefix length 0"),
    (dict(addresses=["192.0.2.0/24"]), "netdev.addresses[0]", "network address"),
    (dict(addresses=["192.0.2.255/24"]), "netdev.addresses[0]", "broadcast address"),
    (dict(addresses=["127.0.0.2/8"]), "netdev.addresses[0]", "loopback"),
    (dict(addresses=["224.0.0.5/24"]), "netdev.addresses[0]", "multicast"),
    (dict(addresses=["fe80::1/64"]), "netdev.addresses[0]", "link-local"),
    (dict(addresses=["0.0.0.0/8"]), "netdev.addresses[0]", "unspecified"),
    (dict(addresses=["192.0.2.1/24", "192.0.2.1/25"]), "netdev.addresses[1]", "twice"),
    (dict(addresses="192.0.2.1/24"), "netdev.addresses", "a list"),
    (dict(addresses=[f"10.0.0.{i}/24" for i in range(1, 18)]), "netdev.addresses", "16"),
    (dict(mtu=67), "netdev.mtu", "from 68 to 65535"),
    (dict(mtu=65536), "netdev.mtu", "from 68 to 65535"),
    (dict(mtu=True), "netdev.mtu", "not an MTU"),
    (dict(mtu="9000"), "netdev.mtu", "not an MTU"),
    (dict(mtu=1279, addresses=["2001:db8::2/64"]), "netdev.mtu", "IPv6's minimum"),
    (dict(hardwareAddress="02:00:00:00:00"), "netdev.hardwareAddress", "not a MAC"),
    (dict(hardwareAddress="03:00:00:00:00:01"), "netdev.hardwareAddress", "multicast"),
    (dict(hardwareAddress="00:00:00:00:00:00"), "netdev.hardwareAddress", "not an address"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "10.0.0.0/8",
                                                "gateway": "198.51.100.1"}]),
     "netdev.routes[0].gateway", "on none of the interface's subnets"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "10.0.0.0/8",
                                                "gateway": "192.0.2.10"}]),
     "netdev.routes[0].gateway", "the interface's own address"),
    (dict(routes=[{"destination": "10.0.0.0/8"}]), "netdev.routes[0]",
     "needs an IPv4 address"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "10.0.0.1/8"}]),
     "netdev.routes[0].destination", "host bits set"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "0.0.0.0/0",
                                                "gateway": "192.0.2.1"}]),
     "netdev.routes[0].destination", "default: true"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"default": True}]),
     "netdev.routes[0].gateway", "needs a gateway"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"default": True, "gateway": "192.0.2.1",
                                                "destination": "10.0.0.0/8"}]),
     "netdev.routes[0]", "has no destination"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"default": True, "gateway": "192.0.2.1"},
                                               {"default": True, "gateway": "192.0.2.2"}]),
     "netdev.routes[1]", "second IPv4 default"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "10.0.0.0/8",
                                                "gateway": "2001:db8::1"}]),
     "netdev.routes[0].gateway", "not an IPv4 address"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "10.0.0.0/8", "via": "x"}]),
     "netdev.routes[0].via", "unknown field"),
    (dict(addresses=["192.0.2.10/24"], routes=[{"destination": "224.0.0.0/4"}]),
     "netdev.routes[0].destination", "not a unicast"),
    (dict(ethtool={"features": {"hw-tc-offload": True}}), "netdev.ethtool.features.hw-tc-offload",
     "not a feature"),
    (dict(ethtool={"features": {"rx-gro": "on"}}), "netdev.ethtool.features.rx-gro",
     "true or false"),
    (dict(ethtool={"offload": {}}), "netdev.ethtool", "features only"),
    (dict(rdma="shared"), "netdev.rdma", "not one of exclusive"),
    (dict(rdma=["exclusive"]), "netdev.rdma", "not one of exclusive"),
]


@pytest.mark.parametrize(("fields", "where", "why"), BAD)
def test_bad_input_is_one_line_naming_the_field(fields: dict[str, Any], where: str,
                                                why: str) -> None:
    with pytest.raises(ConfigDecodeError) as err:
        merge_configs([config(move=True, **fields)])
    message = str(err.value)
    assert err.value.field_path == where, message
    assert why in message and "\n" not in message


def test_interface_settings_without_the_move_are_refused() -> None:
    with pytest.raises(ConfigDecodeError, match="has no effect with move: false"):
        merge_configs([config(move=False, mtu=1500)])
    with pytest.raises(ConfigDecodeError, match="they need move: true"):
        merge_configs([config(addresses=["192.0.2.10/24"])])


def test_the_hook_refuses_what_the_claim_would() -> None:
    with pytest.raises(ValueError, match="routes"):
        from_json({"routes": [{"destination": "10.0.0.0/8"}]})
    with pytest.raises(ValueError, match="unknown field"):
        from_json({"mtu": 1500, "move": True})


def test_the_claim_in_docs_netdev_md_decodes_as_it_says() -> None:
    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "netdev.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    claim = next(d for d in yaml.safe_load_all(block) if d["kind"] == "ResourceClaim")
    [entry] = claim["spec"]["devices"]["config"]
    merged = merge_configs([entry["opaque"]["parameters"]])
    interface = merged.netdev.interface
    assert merged.pod_interface_name == "net1" and interface.mtu == 9000
    assert interface.rdma_exclusive and interface.features == {"rx-gro": True,
                                                               "tx-tcp-segmentation": True}
    assert [str(r.destination) for r in interface.routes or ()] == ["198.51.100.0/24",
                                                                    "203.0.113.0/28"]
