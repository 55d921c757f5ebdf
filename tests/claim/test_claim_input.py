"""Untrusted claim input: UIDs no CDI name can hold, wrong types anywhere in the claim dict,
and unprepare of whatever the kubelet sends."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from agent.claim.identity import UID_MAX_LEN, uid_problem
from agent.claim.model import Claim, ClaimError, ClaimRef
from agent.claim.parse import allocation_json, parse_claim, parse_devices
from tests.fakes.kubelet import ClaimRef as KubeletClaimRef
from tests.plugnode import DRIVER, Node, make_claim

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "env": {"A": "1"}}


@pytest.mark.parametrize("uid", [
    "5f0c2a1e-7d3b-4c55-9a0e-2b8f6d4c1a90", "u1", "A", "a.b_c:d-e", "9" * UID_MAX_LEN,
])
def test_uids_a_cdi_name_can_hold(uid: str) -> None:
    assert uid_problem(uid) is None


@pytest.mark.parametrize(("uid", "why"), [
    ("", "empty"),
    ("a" * (UID_MAX_LEN + 1), "characters long"),
    ("../../etc/passwd", "not one the API server generates"),
    ("a/b", "not one"), ("x\x00y", "not one"), ("new\nline", "not one"), ("ünï", "not one"),
    ("-a", "not one"), ("a-", "not one"), ("a b", "not one"), ("٣", "not one"),
])
def test_uids_refused(uid: str, why: str) -> None:
    problem = uid_problem(uid)
    assert problem is not None and why in problem


def allocated() -> dict[str, Any]:
    return make_claim("c", ["gpu-0"], uid="u1", config=[
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": GOOD}}])


def status(claim: dict[str, Any]) -> Any:
    return claim["status"]


def devices(claim: dict[str, Any]) -> Any:
    return claim["status"]["allocation"]["devices"]


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda c: c["metadata"].__setitem__("uid", 7), "metadata.uid is not a string"),
    (lambda c: c["metadata"].__setitem__("name", ["c"]), "metadata.name is not a string"),
    (lambda c: c["metadata"].__setitem__("namespace", {}), "metadata.namespace is not a string"),
    (lambda c: c.__setitem__("status", ["x"]), "status is not an object"),
    (lambda c: c.__setitem__("status", "allocated"), "status is not an object"),
    (lambda c: status(c).__setitem__("allocation", ["not", "an", "object"]),
     "status.allocation is not an object"),
    (lambda c: status(c).__setitem__("allocation", 1), "status.allocation is not an object"),
    (lambda c: status(c)["allocation"].__setitem__("devices", ["x"]),
     "status.allocation.devices is not an object"),
    (lambda c: devices(c).__setitem__("config", {"a": 1}),
     "status.allocation.devices.config is not a list"),
    (lambda c: devices(c)["config"][0].__setitem__("source", 3),
     r"config\[0\].source is not a string"),
    (lambda c: devices(c)["config"][0]["opaque"].__setitem__("driver", None),
     r"config\[0\].opaque.driver is missing"),
    (lambda c: devices(c)["results"][0].__setitem__("device", 0),
     r"results\[0\].device is missing or not a string"),
])
def test_wrong_types_are_claim_errors_naming_the_field(mutate: Any, path: str) -> None:
    claim = allocated()
    mutate(claim)
    with pytest.raises(ClaimError, match=path):
        parse_claim(claim, expected=ClaimRef("default", "c", "u1"))


@pytest.mark.parametrize("obj", [None, [], "claim", 3])
def test_a_claim_that_is_not_an_object_is_a_claim_error(obj: Any) -> None:
    with pytest.raises(ClaimError, match="not an object"):
        parse_claim(obj, expected=ClaimRef("default", "c", "u1"))


def test_empty_allocation_is_still_not_allocated() -> None:
    claim = allocated()
    status(claim)["allocation"] = {}
    assert not parse_claim(claim).allocated


def test_allocation_json_round_trips_only_our_driver() -> None:
    claim_dict = make_claim("c", ["gpu-0"], uid="u1", results=[
        {"request": "r/sub", "driver": DRIVER, "pool": "p", "device": "d", "adminAccess": True,
         "shareID": "s-1"},
        {"request": "r", "driver": "other.io", "pool": "p", "device": "x"}], config=[
        {"source": "FromClass", "requests": ["r"],
         "opaque": {"driver": DRIVER, "parameters": GOOD}},
        {"source": "FromClaim", "opaque": {"driver": "other.io", "parameters": {}}}])
    claim = parse_claim(claim_dict)
    saved = copy.deepcopy(allocation_json(claim, DRIVER))
    results, configs = parse_devices(saved, "c")
    back = Claim(ref=claim.ref, allocated=True, results=results, configs=configs)
    assert back.results == claim.results_for(DRIVER)
    assert back.configs == tuple(c for c in claim.configs if c.driver == DRIVER)


def kref(uid: str, name: str = "c") -> KubeletClaimRef:
    return KubeletClaimRef(namespace="default", name=name, uid=uid)


def tree(root: Path) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("uid", ["../../etc/passwd", "new\nline", "ünï", "x\x00y", "a" * 300])
def test_bad_uid_is_refused_before_the_claim_is_read(node: Node, uid: str) -> None:
    node.book.put(make_claim("c", ["gpu-0"], uid=uid))
    before = tree(node.root)
    answer = node.kubelet.prepare(DRIVER, [kref(uid)])[uid]
    assert answer.error and "internal error" not in answer.error
    assert "claim UID" in answer.error
    assert node.book.gets == 0
    assert node.kubelet.unprepare(DRIVER, [kref(uid)])[uid].ok
    assert tree(node.root) == before


@pytest.mark.parametrize("uid", ["", "a" * 300, "x\x00y", "../../etc/passwd", "never-seen"])
def test_unprepare_of_what_was_never_prepared_succeeds(node: Node, uid: str) -> None:
    before = tree(node.root)
    assert node.kubelet.unprepare(DRIVER, [kref(uid, "never")])[uid].ok
    assert tree(node.root) == before


def test_uid_not_matching_the_claim_is_refused(node: Node) -> None:
    node.book.put(make_claim("c", ["gpu-0"], uid="u-api"))
    answer = node.kubelet.prepare(DRIVER, [kref("u-kubelet")])["u-kubelet"]
    assert "different claim under this name" in answer.error


def test_short_uid_round_trip_leaves_nothing(node: Node) -> None:
    node.book.put(make_claim("c", ["gpu-0"], uid="u1"))
    answer = node.kubelet.prepare(DRIVER, [kref("u1")])["u1"]
    assert answer.ok and answer.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim=u1-gpu-0",)
    assert node.kubelet.unprepare(DRIVER, [kref("u1")])["u1"].ok
    assert not list(node.cdi_dir.glob("*.json"))


def test_a_replaced_claims_uid_from_the_server_is_shown_on_one_line() -> None:
    # The UID comes from the API server's answer; whatever it holds, the kubelet's event and
    # our log line stay one line.
    claim = {"metadata": {"namespace": "a", "name": "b", "uid": "x\ny"}}
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim, ClaimRef("a", "b", "u"))
    assert "\n" not in str(caught.value) and "'x\\ny'" in str(caught.value)
