"""A hand-rolled protobuf encoder for the wire tests.

Deliberately independent of the generated code and of the protobuf library: every test states
field numbers and wire types itself, taken from the kubelet's field tables.
"""

from __future__ import annotations

VARINT = 0
I64 = 1
LEN = 2
I32 = 5


def varint(value: int) -> bytes:
    """Base-128 varint; negative values are their 64-bit two's complement (10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def int_field(field: int, value: int) -> bytes:
    """int32/int64/uint*/bool/enum: all varint on the wire."""
    return key(field, VARINT) + varint(value)


def len_field(field: int, payload: bytes) -> bytes:
    return key(field, LEN) + varint(len(payload)) + payload


def str_field(field: int, value: str) -> bytes:
    return len_field(field, value.encode())


def map_entry(field: int, map_key: str, value: bytes) -> bytes:
    """A map<string, Message> entry: a nested message with key=1 and value=2, both always set."""
    return len_field(field, str_field(1, map_key) + len_field(2, value))
