from __future__ import annotations

import re

import pytest

from agent.common.k8snames import dns_subdomain_problem
from agent.slices.naming import decode_index, encode_index, generate_name, index_width


@pytest.mark.parametrize(
    ("count", "width"), [(0, 5), (1, 5), (16, 5), (0x100000, 5), (0x100001, 6)]
)
def test_index_width_grows_only_past_five_hex_digits(count: int, width: int) -> None:
    assert index_width(count) == width


def test_encode_is_zero_padded_lowercase_hex() -> None:
    assert encode_index(0, 5) == "00000"
    assert encode_index(26, 5) == "0001a"
    with pytest.raises(ValueError, match=">= 0"):
        encode_index(-1, 5)


def test_decode_reads_back_what_was_encoded() -> None:
    for i in (0, 1, 15, 255, 0xFFFFF):
        assert decode_index(f"{encode_index(i, 5)}-dra-agent.io-node1-abcde", 5) == i


@pytest.mark.parametrize(
    "name",
    [
        "node1-dra-agent.io-abcde",  # the pre-1.36 scheme
        "0000-dra-agent.io-node1-x",  # too short
        "000000-dra-agent.io-node1-x",  # wider than expected
        "0000g-dra-agent.io-node1-x",  # not hex
        "0000A-dra-agent.io-node1-x",  # upper case is never produced
        "00000",  # no separator
    ],
)
def test_decode_rejects_foreign_names(name: str) -> None:
    assert decode_index(name, 5) is None


def test_generate_name_keeps_driver_dots_and_is_a_valid_name_prefix() -> None:
    prefix = generate_name(3, 5, "gpu.Example.com", "node-7.rack2")
    assert prefix == "00003-gpu.example.com-node-7.rack2-"
    assert dns_subdomain_problem(prefix + "x7k2p") is None


def test_generate_name_without_owner() -> None:
    assert generate_name(0, 5, "dra-agent.io", None) == "00000-dra-agent.io-"


def test_truncated_prefix_still_gives_valid_names() -> None:
    # The server keeps 58 characters and appends 5 random ones.
    prefix = generate_name(1, 5, "very-long-driver-name.gpu.example.com", "a" * 60)
    name = prefix[:58] + "bcdfg"
    assert dns_subdomain_problem(name) is None
    assert re.match(r"^00001-", name)
    assert decode_index(name, 5) == 1
