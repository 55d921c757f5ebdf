"""Claim dict parsing and opaque config decoding: clear errors for bad input."""

from __future__ import annotations

from typing import Any

import pytest

from agent.claim.model import ClaimError, ClaimRef, ClaimReplacedError
from agent.claim.opaque import ConfigDecodeError, DeviceConfig, decode_config, merge_configs
from agent.claim.parse import parse_claim
from tests.plugnode import DRIVER, make_claim

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig"}


def test_parse_allocated_claim_with_configs() -> None:
    claim = make_claim("c", ["gpu-0"], results=[
        {"request": "r/sub", "driver": DRIVER, "pool": "p", "device": "d", "adminAccess": True,
         "shareID": "s-1"}], config=[
        {"source": "FromClaim", "requests": ["r"],
         "opaque": {"driver": DRIVER, "parameters": GOOD}},
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": GOOD}}])
    parsed = parse_claim(claim)
    sub = parsed.results[0]
    assert (sub.base_request, sub.admin_access, sub.share_id) == ("r", True, "s-1")
    assert [c.source for c in parsed.configs_for(DRIVER, sub)] == ["FromClass", "FromClaim"]
    other = parsed.results[1]
    assert [c.source for c in parsed.configs_for(DRIVER, other)] == ["FromClass"]


def test_uid_mismatch_is_replaced() -> None:
    claim = make_claim("c", ["gpu-0"])
    with pytest.raises(ClaimReplacedError):
        parse_claim(claim, expected=ClaimRef("default", "c", "other-uid"))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: c.pop("metadata"), "no metadata"),
    (lambda c: c["status"]["allocation"]["devices"].__setitem__("results", {"a": 1}), "not a list"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("pool"),
     r"results\[0\].pool is missing"),
    (lambda c: c["status"]["allocation"]["devices"]["results"].__setitem__(0, "x"),
     r"results\[0\] is not an object"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append({"source": "FromClaim"}),
     "no opaque configuration"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"opaque": {"driver": DRIVER}, "requests": "r"}), "list of request names"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].__setitem__("shareID", 5),
     "shareID is not a string"),
])
def test_malformed_claims_name_the_path(mutate: Any, message: str) -> None:
    claim = make_claim("c", ["gpu-0"])
    mutate(claim)
    with pytest.raises(ClaimError, match=message):
        parse_claim(claim)


def test_unallocated_claim() -> None:
    assert not parse_claim(make_claim("c", allocated=False)).allocated


def test_decode_and_merge_config() -> None:
    assert decode_config({**GOOD, "env": {"A": "1"}}) == DeviceConfig(env={"A": "1"})
    merged = merge_configs([{**GOOD, "env": {"A": "1", "B": "1"}}, {**GOOD, "env": {"A": "2"}}])
    assert merged.env == {"A": "2", "B": "1"}


@pytest.mark.parametrize(("params", "field"), [
    ({**GOOD, "extra": 1}, "extra"),
    ({**GOOD, "env": {"A": 1}}, "env.A"),
    ({**GOOD, "env": ["A=1"]}, "env"),
    ({**GOOD, "env": {f"V{i}": "x" for i in range(65)}}, "env"),
    ({"kind": "DeviceConfig"}, "apiVersion"),
    (None, "parameters"),
])
def test_bad_config_names_the_field(params: Any, field: str) -> None:
    with pytest.raises(ConfigDecodeError) as info:
        decode_config(params)
    assert info.value.field_path == field


@pytest.mark.parametrize("params", [
    {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "a\nb": 1},
    {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "netdev": {"\n": 1}},
])
def test_a_hostile_unknown_key_is_named_on_one_line(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigDecodeError) as caught:
        merge_configs([params])
    assert "\n" not in str(caught.value) and "unknown field" in str(caught.value)


def test_an_env_value_that_is_not_valid_unicode_is_refused_on_its_own() -> None:
    params = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
              "env": {"A": "x\ud800"}}
    with pytest.raises(ConfigDecodeError, match=r"env\.A: value is not valid Unicode"):
        merge_configs([params])
