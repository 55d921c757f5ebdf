"""A reader for glibc's ``/etc/ld.so.cache``: which libraries the dynamic linker knows.

Reading the file (rather than running ``ldconfig -p``) works on a driver root mounted from
another machine or a fixture tree, and costs no process. Layout (glibc ``dl-cache.h``):
an optional old-format block (``ld.so-1.7.0``, 12-byte entries) followed, 8-byte aligned,
by the new format: magic ``glibc-ld.so.cache`` + ``1.1``, then ``nlibs`` and the string
table size, 20 more header bytes (48 in all), then 24-byte entries (flags, key offset,
value offset, osversion, hwcap). New-format string offsets count from the new header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
NEW_HEADER = struct.Struct("<20sII20x")  # magic+version, nlibs, len_strings, 20 unused
NEW_ENTRY = struct.Struct("<iIIIQ")
OLD_ENTRY = struct.Struct("<iII")

FLAG_ELF = 0x0001
FLAG_TYPE_MASK = 0x00FF
FLAG_ARCH_MASK = 0xFF00
#: flags & 0xff00 of 64-bit entries: x86-64, ppc64le, aarch64 (and generic 64-bit).
ARCH_64BIT = frozenset({0x0300, 0x0500, 0x0A00})


class LdCacheError(ValueError):
    def __init__(self, path: Path | None, reason: str) -> None:
        super().__init__(f"{path or 'ld.so.cache'}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LdCacheEntry:
    name: str  # the key: a SONAME such as libcuda.so.1
    path: str  # where the linker finds it, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1
    flags: int

    @property
    def is_64bit(self) -> bool:
        return self.flags & FLAG_ARCH_MASK in ARCH_64BIT


def _cstr(data: bytes, offset: int, path: Path | None) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise LdCacheError(path, f"string offset {offset} outside the file")
    return data[offset:end].decode("utf-8", "surrogateescape")


def parse_ld_cache(data: bytes, path: Path | None = None) -> list[LdCacheEntry]:
    """All ELF entries of a cache file, in file order (the linker's preference order)."""
    start = 0
    if data.startswith(OLD_MAGIC):
        (nlibs,) = struct.unpack_from("<I", data, len(OLD_MAGIC))
        start = len(OLD_MAGIC) + 4 + nlibs * OLD_ENTRY.size
        start = (start + 7) & ~7
        if data[start : start + len(NEW_MAGIC)] != NEW_MAGIC:
            # Only the old format: libc5-era files, never written by a glibc that can run a
            # current NVIDIA driver.
            raise LdCacheError(path, "old-format only cache; not supported")
    if data[start : start + len(NEW_MAGIC)] != NEW_MAGIC:
        raise LdCacheError(path, "not a glibc ld.so.cache (bad magic)")
    try:
        _, nlibs, _ = NEW_HEADER.unpack_from(data, start)
    except struct.error as err:
        raise LdCacheError(path, "truncated header") from err
    entries_at = start + NEW_HEADER.size
    if entries_at + nlibs * NEW_ENTRY.size > len(data):
        raise LdCacheError(path, f"truncated: {nlibs} entries do not fit")
    out: list[LdCacheEntry] = []
    for i in range(nlibs):
        flags, key, value, _, _ = NEW_ENTRY.unpack_from(data, entries_at + i * NEW_ENTRY.size)
        if not flags & FLAG_TYPE_MASK & FLAG_ELF:
            continue
        out.append(
            LdCacheEntry(
                name=_cstr(data, start + key, path),
                path=_cstr(data, start + value, path),
                flags=flags,
            )
        )
    return out


def read_ld_cache(path: Path) -> list[LdCacheEntry]:
    """Parse the cache at ``path``; ``[]`` when the file does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise LdCacheError(path, err.strerror or str(err)) from err
    return parse_ld_cache(data, path)
