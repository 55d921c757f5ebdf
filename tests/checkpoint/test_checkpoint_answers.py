"""A repeated prepare of a completed claim is answered from the checkpoint: the API server is
not needed, not even to rewrite a lost spec; anything the record cannot vouch for takes the
full path (GET, UID check)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from agent.checkpoint.codec import decode
from agent.checkpoint.model import ClaimRecord
from tests.plugnode import DRIVER, Node, make_claim

CONFIG = [{"source": "FromClaim", "requests": ["req"], "opaque": {"driver": DRIVER, "parameters": {
    "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "env": {"MODE": "fast"}}}}]


def spec_file(node: Node, uid: str) -> Any:
    return node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"


def records(node: Node) -> dict[str, ClaimRecord]:
    return dict(decode(node.checkpoint.read_bytes()).claims)


def prepared(node: Node, claim: dict[str, Any]) -> tuple[str, Any]:
    uid = claim["metadata"]["uid"]
    answer = node.prepare(claim)[uid]
    assert answer.ok, answer.error
    return uid, answer


def api_down(node: Node) -> None:
    """Every GET fails from now on, as while the API server is away."""
    node.book.claims.clear()


def test_repeat_needs_no_api_server(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0", "nic-0"], config=CONFIG))
    uid, first = prepared(node, claim)
    gets = node.book.gets
    api_down(node)
    assert node.prepare(claim)[uid] == first
    assert node.book.gets == gets
    record = records(node)[uid]
    assert record.allocation is not None
    assert [r["device"] for r in record.allocation["results"]] == ["gpu-0", "nic-0"]


def test_lost_spec_is_rewritten_from_the_record_identically(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0", "gpu-1"], config=CONFIG))
    uid, first = prepared(node, claim)
    before = spec_file(node, uid).read_text()
    assert "MODE=fast" in before
    api_down(node)
    for path in node.cdi_dir.iterdir():
        path.unlink()  # /var/run is tmpfs
    (node.root / "boot_id").write_text("boot-2\n")
    node.restart()
    assert node.prepare(claim)[uid] == first
    assert spec_file(node, uid).read_text() == before
    assert records(node)[uid].boot_id == "boot-2"


def test_device_gone_after_reboot_is_a_claim_error(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-7"]))
    uid, _ = prepared(node, claim)
    spec_file(node, uid).unlink()
    node.inventory[:] = [d for d in node.inventory if d.name != "gpu-7"]
    answer = node.prepare(claim)[uid]
    assert "gpu-7" in answer.error and "does not exist" in answer.error


def test_replaced_claim_takes_the_full_path(node: Node) -> None:
    old = node.book.put(make_claim("c1", ["gpu-0"]))
    prepared(node, old)
    new = node.book.put(make_claim("c1", ["gpu-0"]))  # same name, new UID
    gets = node.book.gets
    answer = node.prepare(new)[new["metadata"]["uid"]]
    assert node.book.gets == gets + 1
    assert "already prepared for claim" in answer.error  # the old claim still holds gpu-0


def test_a_record_of_another_name_is_not_trusted(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid, _ = prepared(node, claim)
    alias = dict(claim, metadata=dict(claim["metadata"], name="other"))
    api_down(node)
    answer = node.prepare(alias)[uid]
    assert "not found in the API server" in answer.error


def test_legacy_record_without_allocation_reads_the_claim_to_rewrite(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"], config=CONFIG))
    uid, first = prepared(node, claim)
    before = spec_file(node, uid).read_text()
    node.server.preparer.checkpoint.update(
        lambda claims: claims.__setitem__(uid, replace(claims[uid], allocation=None)))
    # Spec present: the record alone answers.
    gets = node.book.gets
    assert node.prepare(claim)[uid] == first and node.book.gets == gets
    # Spec lost: the claim is read for what the record lacks, and the record gains it.
    spec_file(node, uid).unlink()
    assert node.prepare(claim)[uid] == first and node.book.gets == gets + 1
    assert spec_file(node, uid).read_text() == before
    assert records(node)[uid].allocation is not None


def test_recovered_record_takes_the_full_path(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid, first = prepared(node, claim)
    node.server.preparer.checkpoint.update(
        lambda claims: claims.__setitem__(uid, replace(claims[uid], recovered=True)))
    gets = node.book.gets
    assert node.prepare(claim)[uid] == first
    assert node.book.gets == gets + 1


def test_allocation_survives_the_checkpoint_file(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"], config=CONFIG))
    uid, _ = prepared(node, claim)
    raw = json.loads(node.checkpoint.read_text())
    saved = raw["claims"][uid]["allocation"]
    assert saved["config"][0]["opaque"]["parameters"]["env"] == {"MODE": "fast"}
    assert records(node)[uid].to_json()["allocation"] == saved
