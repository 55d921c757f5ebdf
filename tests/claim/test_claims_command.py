"""``dra-agent claims`` renders the checkpoint the plugin wrote."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.plugnode import DRIVER, Node, make_claim


def run(node: Node, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["claims", "--kubelet-dir", str(node.options.kubelet_dir),
               "--driver-name", DRIVER, *args])
    return result.exit_code, result.output


def test_claims_table_json_and_yaml(node: Node) -> None:
    claim = node.book.put(make_claim("train", ["gpu-0", "gpu-1"], namespace="ml"))
    uid = claim["metadata"]["uid"]
    node.prepare(claim)
    code, out = run(node)
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[:5] == ["NAMESPACE", "NAME", "UID", "STATE", "DEVICES"]
    assert row.split()[:5] == ["ml", "train", uid, "PrepareCompleted", "gpu-0,gpu-1"]
    code, out = run(node, "-o", "json")
    (doc,) = json.loads(out)
    assert doc["cdiAnnotations"] == {
        f"cdi.k8s.io/{DRIVER}_{uid}":
            f"k8s.{DRIVER}/claim={uid}-gpu-0,k8s.{DRIVER}/claim={uid}-gpu-1"}
    code, out = run(node, "-o", "yaml")
    assert yaml.safe_load(out)[0]["uid"] == uid


def test_claims_without_checkpoint(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["claims", "--kubelet-dir", str(tmp_path)])
    assert result.exit_code == 0 and "no prepared claims" in result.output


def test_claims_with_corrupt_checkpoint_is_an_error_and_moves_nothing(node: Node) -> None:
    node.checkpoint.write_bytes(b"{oops")
    code, out = run(node)
    assert code == 1 and "corrupt" in out
    assert node.checkpoint.read_bytes() == b"{oops"


def test_claims_refuses_a_fifo_or_symlink_at_the_checkpoint_without_hanging(node: Node) -> None:
    import os

    from tests.checkpoint.test_hostile_files import in_thread

    node.checkpoint.unlink(missing_ok=True)
    os.mkfifo(node.checkpoint)
    code, out = in_thread(lambda: run(node))  # an ordinary open would wait for a writer
    assert code == 1 and "not a regular file" in out and "Traceback" not in out
    node.checkpoint.unlink()
    node.checkpoint.symlink_to("/dev/zero")
    code, out = in_thread(lambda: run(node))
    assert code == 1 and "symbolic link" in out
    assert node.checkpoint.is_symlink()  # the command moves nothing


def test_claims_wide_is_one_row_per_device_with_its_identity(node: Node) -> None:
    from dataclasses import replace

    gpu0 = node.inventory[0]
    node.inventory[0] = replace(gpu0, host=replace(gpu0.host, uuid="GPU-1234"))
    train = node.book.put(make_claim("train", ["gpu-0", "nic-0"], namespace="ml"))
    node.prepare(train)
    uid = train["metadata"]["uid"]
    code, out = run(node, "-o", "wide")
    assert code == 0
    header, *rows = [line.split() for line in out.strip().splitlines()]
    assert header[:9] == ["NAMESPACE", "NAME", "UID", "STATE", "POOL", "DEVICE", "UUID", "PCI",
                          "IFNAME"]
    assert [r[:9] for r in rows] == [
        ["ml", "train", uid, "PrepareCompleted", "node-a", "gpu-0", "GPU-1234", "0000:18:00.0",
         "-"],
        ["ml", "train", uid, "PrepareCompleted", "node-a", "nic-0", "-", "0000:30:00.0", "ens0"],
    ]


def test_claims_wide_prints_no_control_characters_from_the_checkpoint(node: Node) -> None:
    from dataclasses import replace

    from agent.checkpoint.codec import decode, encode

    node.prepare(node.book.put(make_claim("train", ["nic-0"], namespace="ml")))
    data = decode(node.checkpoint.read_bytes())
    node.checkpoint.write_bytes(encode(data.with_claims({
        uid: replace(r, devices=tuple(replace(d, if_name="\x1b]0;pwned\x07\nrow")
                                      for d in r.devices))
        for uid, r in data.claims.items()})))
    code, out = run(node, "-o", "wide")
    assert code == 0 and len(out.strip().splitlines()) == 2
    assert "?]0;pwned??row" in out and "\x1b" not in out


def test_claims_wide_names_each_share_and_what_it_holds(node: Node) -> None:
    from discovery.sharing import parse_sharing, shareable

    shared, _ = shareable(node.inventory[0], parse_sharing("gpu=shares:4"))
    assert shared is not None
    node.inventory[0] = shared
    share = "00000000-0000-4000-8000-000000000001"
    claim = node.book.put(make_claim("part", namespace="ml", results=[{
        "request": "req", "driver": "dra-agent.io", "pool": "node-a", "device": "gpu-0",
        "shareID": share, "consumedCapacity": {"shares": "2"}}]))
    assert node.prepare(claim)[claim["metadata"]["uid"]].ok
    code, out = run(node, "-o", "wide")
    assert code == 0
    header, row = [line.split() for line in out.strip().splitlines()]
    assert header[9] == "SHARE"
    assert row[5] == "gpu-0" and row[9:11] == [share, "shares=2"]
