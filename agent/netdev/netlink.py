"""A netlink socket, the attribute encoding and the request/ack exchange (netlink(7)).

Only what the hook and the agent's RDMA give-back send: requests that want an ack, and dumps
read to their NLMSG_DONE. The socket talks to the network namespace it was opened in, so a
caller enters the namespace first (``agent.netdev.netns``).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator

# Imported by the hook at every container start: typing only for mypy (see config.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Transport(Protocol):
        """One netlink conversation (``Netlink``; tests may record the bytes)."""

        def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
            """Send ``body`` as a message of ``kind`` and return the answers (type, payload)."""
            ...

NETLINK_ROUTE, NETLINK_GENERIC, NETLINK_RDMA = 0, 16, 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLA_F_NESTED = 0x8000
_HEADER = struct.Struct("=IHHII")


class NetlinkError(OSError):
    """The kernel refused a request: ``errno`` is its answer; the message says which."""


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def nested(kind: int, *parts: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(parts))


def parse_attrs(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Attributes from ``offset`` on, by type (nested flag dropped); the last one wins."""
    out: dict[int, bytes] = {}
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out[kind & ~NLA_F_NESTED & 0x7FFF] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out


def attr_text(value: bytes | None) -> str | None:
    return None if value is None else value.split(b"\0", 1)[0].decode(errors="replace")


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of each message in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            break
        yield kind, flags, seq, data[offset + _HEADER.size:offset + length]
        offset += (length + 3) & ~3


class Netlink:
    """A netlink socket of ``protocol`` in the calling thread's network namespace."""

    def __init__(self, protocol: int, timeout_s: float = 5.0) -> None:
        try:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        except OSError as err:
            raise NetlinkError(err.errno, f"netlink protocol {protocol}: "
                                          f"{err.strerror or err}") from None
        self._sock.settimeout(timeout_s)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        self._seq += 1
        seq = self._seq
        flags |= NLM_F_REQUEST
        self._sock.send(_HEADER.pack(_HEADER.size + len(body), kind, flags, seq, 0) + body)
        answers: list[tuple[int, bytes]] = []
        while True:
            data = self._sock.recv(1 << 16)
            for rkind, rflags, rseq, payload in messages(data):
                if rseq != seq:
                    continue  # a late answer to an earlier request
                if rkind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise NetlinkError(code, os.strerror(code))
                    return answers  # the ack
                if rkind == NLMSG_DONE:
                    return answers
                answers.append((rkind, payload))
                if not rflags & NLM_F_MULTI and not flags & NLM_F_ACK:
                    return answers
            if not data:
                raise NetlinkError(errno.EIO, "netlink socket closed")
