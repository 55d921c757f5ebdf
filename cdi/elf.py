"""Read a shared library's ``DT_SONAME``: the name programs link against.

Only what the loader itself uses is read: the program headers, the ``PT_DYNAMIC`` segment and
the ``PT_LOAD`` segments that map the dynamic string table's address to a file offset.
Section headers are not needed (stripped libraries may lack them).
"""

from __future__ import annotations

import struct
from pathlib import Path

PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL = 0
DT_STRTAB = 5
DT_SONAME = 14
_MAX_READ = 64 << 20  # driver libraries are tens of MiB; reading stops at what is needed


class ElfError(ValueError):
    pass


def soname(path: Path) -> str | None:
    """The ``DT_SONAME`` of the ELF file at ``path``; ``None`` if it has none.

    Raises ``ElfError`` for a file that is not a well-formed ELF shared object.
    """
    try:
        with path.open("rb") as f:
            return _soname(f.read(_MAX_READ), path)
    except OSError as err:
        raise ElfError(f"{path}: {err.strerror or err}") from err


def _soname(data: bytes, path: Path) -> str | None:
    if data[:4] != b"\x7fELF" or len(data) < 52:
        raise ElfError(f"{path}: not an ELF file")
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    try:
        if is64:
            phoff, = struct.unpack_from(order + "Q", data, 0x20)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
            ph = struct.Struct(order + "IIQQQQQQ")  # type, flags, offset, vaddr, paddr, filesz..
            dyn = struct.Struct(order + "qQ")
        else:
            phoff, = struct.unpack_from(order + "I", data, 0x1C)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
            ph = struct.Struct(order + "IIIIIIII")  # type, offset, vaddr, paddr, filesz, ...
            dyn = struct.Struct(order + "iI")
        loads: list[tuple[int, int, int]] = []  # (vaddr, filesz, offset)
        dynamic: tuple[int, int] | None = None  # (offset, filesz)
        for i in range(phnum):
            fields = ph.unpack_from(data, phoff + i * phentsize)
            if is64:
                p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = fields
            else:
                p_type, p_offset, p_vaddr, _, p_filesz, _, _, _ = fields
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_filesz, p_offset))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return None
        strtab: int | None = None
        soname_at: int | None = None
        offset, size = dynamic
        for pos in range(offset, offset + size, dyn.size):
            tag, value = dyn.unpack_from(data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_STRTAB:
                strtab = value
            elif tag == DT_SONAME:
                soname_at = value
        if strtab is None or soname_at is None:
            return None
        for vaddr, filesz, seg_offset in loads:
            if vaddr <= strtab < vaddr + filesz:
                start = seg_offset + (strtab - vaddr) + soname_at
                end = data.index(b"\0", start)
                return data[start:end].decode("utf-8", "surrogateescape")
    except (struct.error, ValueError) as err:
        raise ElfError(f"{path}: truncated or malformed ELF: {err}") from err
    raise ElfError(f"{path}: dynamic string table is not in a loaded segment")
