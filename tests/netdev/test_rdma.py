"""The RDMA netns move (RDMA_NLDEV_CMD_SET, as ``rdma dev set DEV netns NS``) and its
give-back. This machine's kernel has no RDMA (no ib_core, NETLINK_RDMA refused), so the
message is checked byte by byte against the kernel's uapi layout (the installed
rdma/rdma_netlink.h where there is one), the exchange against a scripted kernel, and the
real kernel's answer is the error path."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from agent.netdev import rdma
from agent.netdev.host import HostNetdev, Moved, read_moved
from agent.netdev.netlink import NLM_F_ACK, NLM_F_DUMP, NetlinkError, attr_str, attr_u32

UAPI = Path("/usr/include/rdma/rdma_netlink.h")


def uapi_enum(text: str, first: str) -> dict[str, int]:
    """The values of the C enum whose members include ``first``."""
    for body in re.findall(r"enum\s*\w*\s*\{(.*?)\};", text, re.S):
        if first not in body:
            continue
        values, value = {}, -1
        for raw in re.sub(r"/\*.*?\*/", "", body, flags=re.S).split(","):
            item = raw.strip()
            if not item:
                continue
            name, _, given = (part.strip() for part in item.partition("="))
            if not given:
                value += 1
            elif given in values:  # an alias of an earlier member
                value = values[given]
            elif re.fullmatch(r"0x[0-9a-fA-F]+|[0-9]+", given):
                value = int(given, 0)
            else:
                continue  # an expression (..._MAX = __..._MAX - 1): not one we read
            values[name] = value
        return values
    raise AssertionError(f"no enum with {first}")


@pytest.mark.skipif(not UAPI.exists(), reason="no kernel uapi headers installed")
def test_the_numbers_are_the_kernels_uapi() -> None:
    text = UAPI.read_text()
    assert uapi_enum(text, "RDMA_NL_NLDEV")["RDMA_NL_NLDEV"] == rdma.RDMA_NL_NLDEV
    commands = uapi_enum(text, "RDMA_NLDEV_CMD_SYS_GET")
    assert (commands["RDMA_NLDEV_CMD_GET"], commands["RDMA_NLDEV_CMD_SET"],
            commands["RDMA_NLDEV_CMD_SYS_GET"]) == (
        rdma.RDMA_NLDEV_CMD_GET, rdma.RDMA_NLDEV_CMD_SET, rdma.RDMA_NLDEV_CMD_SYS_GET)
    attrs = uapi_enum(text, "RDMA_NLDEV_NET_NS_FD")
    assert (attrs["RDMA_NLDEV_ATTR_DEV_INDEX"], attrs["RDMA_NLDEV_ATTR_DEV_NAME"],
            attrs["RDMA_NLDEV_SYS_ATTR_NETNS_MODE"], attrs["RDMA_NLDEV_NET_NS_FD"]) == (
        rdma.RDMA_NLDEV_ATTR_DEV_INDEX, rdma.RDMA_NLDEV_ATTR_DEV_NAME,
        rdma.RDMA_NLDEV_SYS_ATTR_NETNS_MODE, rdma.RDMA_NLDEV_NET_NS_FD)
    assert "#define RDMA_NL_GET_TYPE(client, op) ((client << 10) + op)" in text


def test_the_move_message_is_two_u32_attributes() -> None:
    # nla_len 8, nla_type; the u32 in host order, as nla_get_u32 reads it.
    assert rdma.move_message(3, 17) == struct.pack("=HHI HHI".replace(" ", ""),
                                                   8, 1, 3, 8, 68, 17)
    assert rdma.nldev_type(rdma.RDMA_NLDEV_CMD_SET) == (5 << 10) + 2 == 5122


class ScriptedKernel:
    """A ``Transport`` that answers as the kernel would and keeps what it was sent."""

    def __init__(self, devices: dict[str, int], refuse: int = 0, mode: int = 0) -> None:
        self.devices, self.refuse, self.mode = devices, refuse, mode
        self.sent: list[tuple[int, int, bytes]] = []

    def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        self.sent.append((kind, flags, body))
        if kind == rdma.nldev_type(rdma.RDMA_NLDEV_CMD_GET):
            return [(kind, attr_u32(1, index) + attr_str(2, name))
                    for name, index in self.devices.items()]
        if kind == rdma.nldev_type(rdma.RDMA_NLDEV_CMD_SYS_GET):
            return [(kind, struct.pack("=HHB3x", 5, 66, self.mode))]
        if self.refuse:
            raise NetlinkError(self.refuse, os.strerror(self.refuse))
        return []


def test_a_move_finds_the_index_by_name_then_sets_the_namespace() -> None:
    kernel = ScriptedKernel({"mlx5_0": 4, "mlx5_1": 9})
    rdma.move_device(kernel, "mlx5_1", 33)
    assert kernel.sent == [(5121, NLM_F_DUMP, b""), (5122, NLM_F_ACK, rdma.move_message(9, 33))]


def test_a_device_the_namespace_does_not_see_is_enodev_and_nothing_is_set() -> None:
    kernel = ScriptedKernel({"mlx5_0": 4})
    with pytest.raises(NetlinkError) as err:
        rdma.move_device(kernel, "mlx5_7", 33)
    assert (err.value.errno, err.value.strerror) == (
        19, "RDMA device mlx5_7: not in this network namespace")
    assert [kind for kind, _, _ in kernel.sent] == [5121]


def test_shared_mode_says_how_to_change_it() -> None:
    with pytest.raises(NetlinkError) as err:
        rdma.move_device(ScriptedKernel({"mlx5_0": 4}, refuse=95), "mlx5_0", 3)
    assert "rdma system set netns exclusive" in str(err.value.strerror)


def test_the_mode_is_read_from_the_sys_answer() -> None:
    assert rdma.netns_mode(ScriptedKernel({}, mode=1)) == "shared"
    assert rdma.netns_mode(ScriptedKernel({}, mode=0)) == "exclusive"


@pytest.mark.skipif(Path("/sys/class/infiniband").exists(), reason="this kernel has RDMA")
def test_a_kernel_without_rdma_has_no_mode() -> None:
    assert HostNetdev().rdma_mode() is None


def test_a_namespace_gone_needs_no_give_back(tmp_path: Path) -> None:
    moved = Moved(rdma_device="mlx5_0", netns="/run/netns/gone-for-good", inode=1)
    assert "namespace gone" in HostNetdev().give_back(moved)


def test_a_reused_namespace_name_is_not_entered() -> None:
    here = Path("/proc/self/ns/net")
    moved = Moved(rdma_device="mlx5_0", netns=f"/proc/{os.getpid()}/ns/net",
                  inode=here.stat().st_ino + 1)
    assert "reused" in HostNetdev().give_back(moved)


@pytest.mark.parametrize("text", [
    '{"rdmaDevice": "mlx5_0", "netns": "/etc/passwd", "inode": 5}',
    '{"rdmaDevice": "mlx5_0", "netns": "/run/netns/../../etc", "inode": 5}',
    '{"rdmaDevice": "mlx5_0", "netns": "/run/netns/x", "inode": true}',
    '["not", "an", "object"]',
    "{broken",
])
def test_a_hook_record_naming_anything_else_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        read_moved(path)
    assert read_moved(tmp_path / "none.json") is None


def test_giving_back_from_a_live_namespace_on_a_kernel_without_rdma_is_the_error(
        pod: object) -> None:
    """The namespace is still there (the pod not yet torn down): the give-back enters it and
    asks its RDMA netlink, which this kernel lacks; unprepare fails with that, and the kubelet
    retries."""
    if Path("/sys/class/infiniband").exists():
        pytest.skip("this kernel has RDMA")
    path = pod.netns_path  # type: ignore[attr-defined]
    moved = Moved(rdma_device="mlx5_0", netns=path, inode=Path(path).stat().st_ino)
    with pytest.raises(NetlinkError) as err:
        HostNetdev().give_back(moved)
    assert err.value.strerror == "netlink protocol 20: Protocol not supported"
