"""``dra_agent_claim_device_info``: one series per prepared device, naming the claim and the
hardware (GPU UUID, PCI address, interface), rebuilt from the checkpoint on every change."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.checkpoint.codec import checksum, decode, encode
from agent.common.metrics import LABEL_VALUE_MAX, Metrics
from tests.plugnode import NODE, Node, make_claim

GPU0_UUID = "GPU-3a8b0c1d-0000-4000-8000-000000000000"
SWAPPED_UUID = "GPU-ffffffff-0000-4000-8000-000000000001"


def series(metrics: Metrics) -> list[dict[str, str]]:
    """The info metric's label sets, read back through the text exposition format."""
    text = generate_latest(metrics.registry).decode()
    out: list[dict[str, str]] = []
    for family in text_string_to_metric_families(text):
        if family.name == "dra_agent_claim_device_info":
            assert {s.value for s in family.samples} <= {1.0}
            out += [dict(s.labels) for s in family.samples]
    return out


def prepared_devices(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("dra_agent_prepared_devices")
    assert value is not None
    return value


def row(namespace: str, claim: str, device: str, uuid: str = "", pci: str = "",
        ifname: str = "") -> dict[str, str]:
    return {"namespace": namespace, "claim": claim, "pool": NODE, "device": device,
            "UUID": uuid, "pci_bus_id": pci, "ifname": ifname}


def with_gpu0_uuid(node: Node, uuid: str = GPU0_UUID) -> None:
    gpu0 = node.inventory[0]
    node.inventory[0] = replace(gpu0, host=replace(gpu0.host, uuid=uuid))


def prepare_gpu_and_nic(node: Node) -> tuple[dict[str, Any], dict[str, Any]]:
    with_gpu0_uuid(node)
    train = node.book.put(make_claim("train", ["gpu-0"], namespace="ml"))
    net = node.book.put(make_claim("net", ["nic-1"], namespace="ml"))
    answer = node.prepare(train, net)
    assert all(not r.error for r in answer.values()), answer
    return train, net


GPU_ROW = row("ml", "train", "gpu-0", uuid=GPU0_UUID, pci="0000:18:00.0")
NIC_ROW = row("ml", "net", "nic-1", pci="0000:31:00.0", ifname="ens1")


def rewrite_checkpoint(node: Node, change: Any) -> None:
    """Edit the records as a newer/older agent or a hand would, with a valid checksum."""
    data = decode(node.checkpoint.read_bytes())
    node.checkpoint.write_bytes(encode(data.with_claims(
        {uid: change(record) for uid, record in data.claims.items()})))


def test_prepared_gpu_and_nic_are_one_series_each_with_their_identity(node: Node) -> None:
    assert series(node.metrics) == []
    prepare_gpu_and_nic(node)
    assert sorted(series(node.metrics), key=str) == sorted([GPU_ROW, NIC_ROW], key=str)
    assert prepared_devices(node.metrics) == 2


def test_identity_is_in_the_checkpoint(node: Node) -> None:
    prepare_gpu_and_nic(node)
    doc = json.loads(node.checkpoint.read_bytes())
    devices = {d["device"]: d for r in doc["claims"].values() for d in r["devices"]}
    assert devices["gpu-0"]["uuid"] == GPU0_UUID
    assert devices["gpu-0"]["pciAddress"] == "0000:18:00.0"
    assert "ifName" not in devices["gpu-0"]
    assert devices["nic-1"]["ifName"] == "ens1"


def test_unprepare_removes_exactly_that_claims_series(node: Node) -> None:
    train, net = prepare_gpu_and_nic(node)
    node.unprepare(train)
    assert series(node.metrics) == [NIC_ROW]
    node.unprepare(net)
    assert series(node.metrics) == []
    assert prepared_devices(node.metrics) == 0


def test_after_a_restart_the_series_come_from_the_checkpoint_even_if_the_device_is_gone(
    node: Node,
) -> None:
    prepare_gpu_and_nic(node)
    node.inventory[:] = [d for d in node.inventory if d.name != "gpu-0"]
    node.metrics = Metrics()  # a new process: nothing carried over in memory
    node.restart()
    assert sorted(series(node.metrics), key=str) == sorted([GPU_ROW, NIC_ROW], key=str)


def test_a_spec_rebuilt_after_reboot_names_the_card_now_in_the_slot(node: Node) -> None:
    prepare_gpu_and_nic(node)
    with_gpu0_uuid(node, SWAPPED_UUID)  # same PCI slot, so same device name, another card
    node.prepare_options.boot_id_path.write_text("boot-2\n")
    node.metrics = Metrics()
    node.restart()
    assert {**GPU_ROW, "UUID": SWAPPED_UUID} in series(node.metrics)
    doc = json.loads(node.checkpoint.read_bytes())
    assert SWAPPED_UUID in json.dumps(doc) and GPU0_UUID not in json.dumps(doc)


def test_a_record_from_before_identities_were_kept_is_read_and_shown_without_them(
    node: Node,
) -> None:
    prepare_gpu_and_nic(node)
    rewrite_checkpoint(node, lambda r: replace(r, devices=tuple(
        replace(d, uuid=None, if_name=None, pci_address=None) for d in r.devices)))
    assert "uuid" not in node.checkpoint.read_text()
    node.metrics = Metrics()
    node.restart()
    assert sorted(series(node.metrics), key=str) == sorted(
        [row("ml", "train", "gpu-0"), row("ml", "net", "nic-1")], key=str)


def test_a_corrupt_record_leaves_the_adopted_devices_counted_once(node: Node) -> None:
    prepare_gpu_and_nic(node)
    doc = json.loads(node.checkpoint.read_bytes())
    for record in doc["claims"].values():
        for device in record["devices"]:
            device["uuid"] = 7  # a number where a string belongs: the file cannot be trusted
    doc["checksum"] = checksum(doc)
    node.checkpoint.write_text(json.dumps(doc))
    node.metrics = Metrics()
    node.restart()
    # The records are kept as unreadable (#28: a dropped record frees its devices): their
    # devices stay reserved, with the claim names they had and no identity, and the info
    # metric says the same as the device gauge.
    assert sorted(series(node.metrics), key=str) == sorted(
        [row("ml", "train", "gpu-0"), row("ml", "net", "nic-1")], key=str)
    assert prepared_devices(node.metrics) == 2
    assert node.metrics.registry.get_sample_value("dra_agent_checkpoint_corrupt_total") == 1


def test_hostile_identity_strings_cannot_break_the_exposition(node: Node) -> None:
    prepare_gpu_and_nic(node)
    evil = 'GPU-"}\nfake_metric{x="1"} 1\n\x1b[2J\\\r\0'
    long = "x" * 100_000
    rewrite_checkpoint(node, lambda r: replace(r, devices=tuple(
        replace(d, uuid=evil, if_name=long) for d in r.devices)))
    node.metrics = Metrics()
    node.restart()
    text = generate_latest(node.metrics.registry).decode()
    assert "fake_metric" not in [f.name for f in text_string_to_metric_families(text)]
    got = series(node.metrics)
    assert len(got) == 2
    for labels in got:
        assert labels["UUID"] == 'GPU-"}?fake_metric{x="1"} 1??[2J\\??'
        assert labels["ifname"] == "x" * LABEL_VALUE_MAX
    assert max(len(line) for line in text.splitlines()) < 8 * LABEL_VALUE_MAX
