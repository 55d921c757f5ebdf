"""Fixture hosts: a fake driver root, /dev, /proc and /sys with the real NVIDIA file layout.

Libraries are real (minimal) ELF shared objects carrying a DT_SONAME, the ld cache is written
in glibc's binary format, and device nodes are real character devices made with mknod. Where
mknod is not permitted the node is a symlink to /dev/null; tests therefore take expected
numbers from ``os.stat`` of the fixture, never from constants.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

RM = "570.86.15"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
#: file stem -> SONAME major, as a real 570 driver ships them (a representative subset).
DRIVER_LIBS = {
    "libcuda.so": "1",
    "libnvidia-ml.so": "1",
    "libnvidia-ptxjitcompiler.so": "1",
    "libnvidia-nvvm.so": "4",
    "libnvidia-gpucomp.so": None,  # no SONAME link on the host: loaded by full name
    "libnvidia-cfg.so": "1",
    "libnvidia-opencl.so": "1",
}
X86_64_LIBC6 = 0x0303  # ELF, x86-64 libc6
I386_LIBC6 = 0x0003


def build_elf(soname: str | None) -> bytes:
    """A minimal little-endian ELF64 shared object with PT_LOAD, PT_DYNAMIC and DT_SONAME."""
    ehdr_size, phdr_size = 64, 56
    strtab = b"\0" + (soname.encode() + b"\0" if soname else b"")
    strtab_off = ehdr_size + 2 * phdr_size
    dyn_off = (strtab_off + len(strtab) + 7) & ~7
    dyn = struct.pack("<qQ", 5, strtab_off) + struct.pack("<qQ", 10, len(strtab))
    if soname:
        dyn += struct.pack("<qQ", 14, 1)
    dyn += struct.pack("<qQ", 0, 0)
    total = dyn_off + len(dyn)
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr += struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, ehdr_size, 0, 0, ehdr_size, phdr_size, 2, 64, 0, 0
    )
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, total, total, 0x1000)
    dynamic = struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, len(dyn), len(dyn), 8)
    body = ehdr + load + dynamic + strtab
    return body + bytes(dyn_off - len(body)) + dyn


def build_ld_cache(entries: list[tuple[str, str, int]]) -> bytes:
    """glibc's new-format ld.so.cache for (name, path, flags) entries."""
    header_size, entry_size = 48, 24
    strings = b""
    offsets: list[tuple[int, int]] = []
    base = header_size + entry_size * len(entries)
    for name, path, _ in entries:
        key = base + len(strings)
        strings += name.encode() + b"\0"
        value = base + len(strings)
        strings += path.encode() + b"\0"
        offsets.append((key, value))
    out = struct.pack("<20sII20x", b"glibc-ld.so.cache1.1", len(entries), len(strings))
    for (_, _, flags), (key, value) in zip(entries, offsets, strict=True):
        out += struct.pack("<iIIIQ", flags, key, value, 0, 0)
    return out + strings


def make_char_node(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(path, mode)
    except PermissionError:
        os.symlink("/dev/null", path)


def write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    os.chmod(path, mode)
    return path


def rel(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


@dataclass
class FakeHost:
    base: Path

    @property
    def root(self) -> Path:
        return self.base / "driver-root"

    @property
    def dev(self) -> Path:
        return self.base / "dev"

    @property
    def proc(self) -> Path:
        return self.base / "proc"

    @property
    def sys(self) -> Path:
        return self.base / "sys"

    def node(self, path: str) -> tuple[int, int, int]:
        """(major, minor, permission bits) of a fixture node, as the host reports them."""
        st = os.stat(self.dev / path.removeprefix("/dev/"))
        return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)

    # -- NVIDIA driver -------------------------------------------------------------------

    def install_driver(self, version: str = RM, *, hook: str | None = None) -> None:
        """Libraries + links, ld cache, tools, firmware, persistenced socket, ldconfig."""
        lib = rel(self.root, LIB_DIR)
        cache: list[tuple[str, str, int]] = []
        for stem, major in DRIVER_LIBS.items():
            soname = f"{stem}.{major}" if major else None
            write(lib / f"{stem}.{version}", build_elf(soname or f"{stem}.{version}"))
            if soname:
                (lib / soname).symlink_to(f"{stem}.{version}")
                cache.append((soname, f"{LIB_DIR}/{soname}", X86_64_LIBC6))
        (lib / "libcuda.so").symlink_to("libcuda.so.1")
        write(lib / "vdpau" / f"libvdpau_nvidia.so.{version}", build_elf("libvdpau_nvidia.so.1"))
        write(lib / "libz.so.1.2.13", build_elf("libz.so.1"))  # not the driver's
        # A 32-bit libcuda in the cache must not pull its directory in.
        write(
            rel(self.root, "/usr/lib/i386-linux-gnu") / f"libcuda.so.{version}",
            build_elf("libcuda.so.1"),
        )
        cache.append(("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", I386_LIBC6))
        cache.append(("libz.so.1", f"{LIB_DIR}/libz.so.1", X86_64_LIBC6))
        write(rel(self.root, "/etc/ld.so.cache"), build_ld_cache(cache))
        for tool in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"):
            write(rel(self.root, f"/usr/bin/{tool}"), "#!/bin/sh\n", 0o755)
        for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            write(rel(self.root, f"/lib/firmware/nvidia/{version}/{fw}"), b"\0")
        write(rel(self.root, "/run/nvidia-persistenced/socket"), b"")
        write(rel(self.root, "/sbin/ldconfig"), "#!/bin/sh\n", 0o755)
        if hook:
            write(
                rel(self.root, "/usr/bin/nvidia-cdi-hook"),
                f"#!/bin/sh\necho 'NVIDIA CDI Hook version {hook}'\necho 'commit: abc'\n",
                0o755,
            )
        self.load_kernel_module(version)

    def load_kernel_module(self, version: str = RM) -> None:
        write(
            self.proc / "driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release "
            "Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jan  7 17:41:15 UTC 2025\n"
            "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n",
        )
        write(
            self.proc / "devices",
            "Character devices:\n  1 mem\n 10 misc\n195 nvidia-frontend\n"
            "231 infiniband_verbs\n235 nvidia-caps\n510 nvidia-uvm\n\n"
            "Block devices:\n  8 sd\n",
        )

    def make_control_nodes(self, modeset: bool = True) -> None:
        make_char_node(self.dev / "nvidiactl", 195, 255)
        make_char_node(self.dev / "nvidia-uvm", 510, 0)
        make_char_node(self.dev / "nvidia-uvm-tools", 510, 1)
        if modeset:
            make_char_node(self.dev / "nvidia-modeset", 195, 254)

    def add_gpu(self, minor: int, pci: str, *, node: bool = True) -> None:
        if node:
            make_char_node(self.dev / f"nvidia{minor}", 195, minor)
        write(
            self.proc / f"driver/nvidia/gpus/{pci}/information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-{minor:08d}-0000-0000-0000"
            f"-000000000000\nBus Location: \t {pci}\nDevice Minor: \t {minor}\n",
        )

    def add_mig(self, parent_minor: int, gi: int, ci: int) -> tuple[int, int]:
        """Capability files for one GI/CI; returns their cap minors (MIG user guide formula)."""
        gi_minor = 3 + 135 * parent_minor + 9 * gi
        ci_minor = 4 + 135 * parent_minor + 9 * gi + ci
        base = self.proc / f"driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{gi}"
        body = "DeviceFileMinor: {}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
        write(base / "access", body.format(gi_minor))
        write(base / f"ci{ci}" / "access", body.format(ci_minor))
        return gi_minor, ci_minor

    # -- NICs, VFIO, other GPUs ----------------------------------------------------------

    def add_rdma(self, ibdev: str, index: int, *, mad: bool = True) -> None:
        write(self.sys / f"class/infiniband_verbs/uverbs{index}/ibdev", ibdev + "\n")
        make_char_node(self.dev / f"infiniband/uverbs{index}", 231, 192 + index)
        if mad:
            write(self.sys / f"class/infiniband_mad/umad{index}/ibdev", ibdev + "\n")
            write(self.sys / f"class/infiniband_mad/issm{index}/ibdev", ibdev + "\n")
            make_char_node(self.dev / f"infiniband/umad{index}", 231, index)
            make_char_node(self.dev / f"infiniband/issm{index}", 231, 64 + index)

    def add_rdma_cm(self) -> None:
        make_char_node(self.dev / "infiniband/rdma_cm", 10, 58)

    def add_vfio(self, pci: str, group: int) -> None:
        groups = self.sys / "kernel/iommu_groups" / str(group)
        groups.mkdir(parents=True, exist_ok=True)
        dev = self.sys / "bus/pci/devices" / pci
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "iommu_group").symlink_to(f"../../../kernel/iommu_groups/{group}")
        make_char_node(self.dev / f"vfio/{group}", 240, group % 256)
        if not (self.dev / "vfio/vfio").exists():
            make_char_node(self.dev / "vfio/vfio", 10, 196)

    def add_drm(self, pci: str, card: int, render: int, *, kfd: bool = False) -> None:
        drm = self.sys / "bus/pci/devices" / pci / "drm"
        (drm / f"card{card}").mkdir(parents=True)
        (drm / f"renderD{render}").mkdir(parents=True)
        make_char_node(self.dev / f"dri/card{card}", 226, card)
        make_char_node(self.dev / f"dri/renderD{render}", 226, render)
        if kfd:
            make_char_node(self.dev / "kfd", 236, 0)
