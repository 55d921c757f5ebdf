"""Garbage in, per-claim answers out: fuzzed ResourceClaims, gRPC requests and opaque configs
against a live plugin. Invariants after every case:

* every claim UID of the request gets exactly one answer, an error or devices, and nothing else;
* a success names devices of this node with well-formed CDI IDs, written in the claim's spec;
* the plugin keeps serving, and unprepare of what was prepared works and leaves nothing;
* no file anywhere else under the node's root changes (``../`` in a name must not escape).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import strategies as fs
from tests.fuzz.conftest import DRIVER, NODE, FuzzNode

CDI_ID = re.compile(r"k8s\.dra-agent\.io/claim=[A-Za-z0-9][A-Za-z0-9_.:-]*")
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def ref_of(claim: Any) -> tuple[str, str, str]:
    """The reference the kubelet would send for this claim (strings, as the protocol needs)."""
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    meta = meta if isinstance(meta, dict) else {}

    def text(key: str, default: str) -> str:
        value = meta.get(key, default)
        return value if isinstance(value, str) else default

    return text("namespace", "default"), text("name", "claim"), text("uid", str(uuid.uuid4()))


def check_round(node: FuzzNode, refs: list[tuple[str, str, str]]) -> None:
    """Prepare ``refs``, check every answer, unprepare them, check nothing is left."""
    before = node.outside_state()
    try:
        check_answers(node, refs, before)
    finally:
        # A failed case must not leave state behind for the next one (shrinking reruns).
        node.unprepare(list({uid: (ns, name, uid) for ns, name, uid in refs}.values()))


def check_answers(node: FuzzNode, refs: list[tuple[str, str, str]], before: object) -> None:
    asked = {uid for _, _, uid in refs}
    if len(asked) < len(refs):
        # The kubelet never repeats a claim in one call; the agent refuses such a request as a
        # whole, naming why, and does nothing.
        for call in (node.prepare, node.unprepare):
            with pytest.raises(grpc.RpcError) as refused:
                call(refs)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "twice" in refused.value.details()
        node.count("duplicate UIDs refused")
        assert node.spec_files() == {}
        assert node.server.preparer.checkpoint.claims() == {}
        return
    prepared = node.prepare(refs)
    assert set(prepared.claims) == asked  # none skipped, none invented
    specs = node.spec_files()
    ours = set(node.device_names())
    for uid, answer in prepared.claims.items():
        if answer.error:
            assert not answer.devices
            node.count("prepare error")
            continue
        node.count("prepare ok")
        if not answer.devices:
            # No result for this driver: nothing to prepare, so nothing written.
            assert uid not in specs
            continue
        assert uid in specs, f"prepared {uid!r} without a spec file"
        spec_names = {d["name"] for d in json.loads(specs[uid].read_text())["devices"]}
        for device in answer.devices:
            assert device.pool_name == NODE and device.device_name in ours
            assert device.cdi_device_ids
            for cdi_id in device.cdi_device_ids:
                assert CDI_ID.fullmatch(cdi_id), cdi_id
                assert cdi_id.split("=", 1)[1] in spec_names
    assert set(specs) <= {u for u, a in prepared.claims.items() if a.devices}

    unprepared = node.unprepare(refs)
    assert set(unprepared.claims) == asked
    for uid, answer in unprepared.claims.items():
        if not prepared.claims[uid].error:
            # What was prepared can always be unprepared.
            assert not answer.error, (uid, answer.error)
        elif answer.error:
            # Refused twice (an empty UID; one no file name can hold): said per claim.
            node.count("unprepare error")
            assert uid in answer.error or not uid, answer.error
    internal = [a.error for a in prepared.claims.values() if "internal error" in a.error]
    for _ in internal:
        node.count("prepare internal error")
    assert node.spec_files() == {}
    assert node.server.preparer.checkpoint.claims() == {}
    assert node.outside_state() == before


def test_fuzzed_claims(fuzz_node: FuzzNode) -> None:
    devices = fuzz_node.device_names()

    @FUZZ
    @given(claim=fs.claims(devices, NODE))
    def case(claim: dict[str, Any]) -> None:
        fuzz_node.count("claims")
        ref = ref_of(claim)
        fuzz_node.claims.claims = {(ref[0], ref[1]): claim}
        check_round(fuzz_node, [ref])

    case()


def test_fuzzed_opaque_configs(fuzz_node: FuzzNode) -> None:
    gpu, nic = "gpu-0", next(d for d in fuzz_node.device_names() if d.startswith("nic-"))

    @FUZZ
    @given(configs=st.lists(fs.config_entry(), min_size=1, max_size=4))
    def case(configs: list[dict[str, Any]]) -> None:
        fuzz_node.count("opaque configs")
        uid = str(uuid.uuid4())
        fuzz_node.claims.claims = {("default", "claim"): {
            "metadata": {"namespace": "default", "name": "claim", "uid": uid},
            "status": {"allocation": {"devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": gpu},
                    {"request": "nic", "driver": DRIVER, "pool": NODE, "device": nic},
                ],
                "config": configs,
            }}},
        }}
        check_round(fuzz_node, [("default", "claim", uid)])

    case()


def valid_claim(namespace: str, name: str, uid: str, device: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]}}},
    }


def test_fuzzed_requests(fuzz_node: FuzzNode) -> None:
    """Empty UIDs, duplicates, unknown claims, claims sharing a device, odd names."""
    gpus = [d for d in fuzz_node.device_names() if d.startswith("gpu-")]

    @FUZZ
    @given(refs=st.lists(fs.refs, max_size=40), dup=st.integers(min_value=0, max_value=5),
           known=st.lists(st.booleans(), max_size=40))
    def case(refs: list[tuple[str, str, str]], dup: int, known: list[bool]) -> None:
        fuzz_node.count("requests")
        refs = refs + refs[:dup]  # the same claim twice in one call
        book: dict[tuple[str, str], Any] = {}
        for i, (ns, name, uid) in enumerate(refs):
            if i < len(known) and known[i]:
                # Two claims may be allocated the same device: one of them must fail.
                book[(ns, name)] = valid_claim(ns, name, uid, gpus[i % len(gpus)])
        fuzz_node.claims.claims = book
        check_round(fuzz_node, refs)

    case()


def test_huge_batch(fuzz_node: FuzzNode) -> None:
    """2,000 claims in one call: half unknown, the rest each allocated a GPU of eight."""
    gpus = [d for d in fuzz_node.device_names() if d.startswith("gpu-")]
    refs = [("ns", f"c{i}", str(uuid.uuid4())) for i in range(2000)]
    fuzz_node.claims.claims = {
        (ns, name): valid_claim(ns, name, uid, gpus[(i // 2) % len(gpus)])
        for i, (ns, name, uid) in enumerate(refs) if i % 2 == 0
    }
    fuzz_node.count("huge batch claims")
    answers = fuzz_node.prepare(refs).claims
    try:
        assert len(answers) == len(refs)
        # A device belongs to one claim: the first claim for each GPU wins, the rest fail.
        won = sorted(d.device_name for a in answers.values() if not a.error for d in a.devices)
        assert won == gpus
        assert sorted(fuzz_node.spec_files()) == sorted(u for u, a in answers.items()
                                                        if not a.error)
    finally:
        fuzz_node.unprepare(refs)
    check_round(fuzz_node, refs)


def test_plugin_still_serves_after_the_fuzzing(fuzz_node: FuzzNode) -> None:
    uid = str(uuid.uuid4())
    fuzz_node.claims.claims = {("default", "after"): valid_claim("default", "after", uid,
                                                                 "gpu-3")}
    answer = fuzz_node.prepare([("default", "after", uid)]).claims[uid]
    assert not answer.error and [d.device_name for d in answer.devices] == ["gpu-3"]
    assert not fuzz_node.unprepare([("default", "after", uid)]).claims[uid].error


def test_claim_uid_with_a_nul_byte_never_sticks(fuzz_node: FuzzNode) -> None:
    uid = "x\x00y"
    # No result for this driver: prepare has nothing to write and records the claim as done.
    fuzz_node.claims.claims = {("default", "nul"): {
        "metadata": {"namespace": "default", "name": "nul", "uid": uid},
        "status": {"allocation": {"devices": {"results": []}}},
    }}
    try:
        prepared = fuzz_node.prepare([("default", "nul", uid)]).claims[uid]
        unprepared = fuzz_node.unprepare([("default", "nul", uid)]).claims[uid]
        assert prepared.error or not unprepared.error, unprepared.error
        assert fuzz_node.server.preparer.checkpoint.claims() == {}
    finally:
        fuzz_node.server.preparer.checkpoint.update(lambda claims: claims.pop(uid, None))


def test_unprepare_of_a_claim_never_prepared_succeeds_whatever_its_uid(
    fuzz_node: FuzzNode,
) -> None:
    # The kubelet unprepares claims whose prepare failed, when their pod goes away; an error
    # here keeps the pod terminating for ever.
    for uid in ("a" * 300, "x\x00y"):
        answer = fuzz_node.unprepare([("default", "never", uid)]).claims[uid]
        assert not answer.error, answer.error


def test_allocation_that_is_not_an_object_is_a_claim_error(fuzz_node: FuzzNode) -> None:
    uid = str(uuid.uuid4())
    fuzz_node.claims.claims = {("default", "odd"): {
        "metadata": {"namespace": "default", "name": "odd", "uid": uid},
        "status": {"allocation": ["not", "an", "object"]},
    }}
    answer = fuzz_node.prepare([("default", "odd", uid)]).claims[uid]
    assert "status.allocation" in answer.error and "internal error" not in answer.error


def test_a_uid_no_cdi_name_can_hold_is_refused_up_front(fuzz_node: FuzzNode) -> None:
    for uid in ("../../etc/passwd", "new\nline", "ünï"):
        fuzz_node.claims.claims = {("default", "c"): valid_claim("default", "c", uid, "gpu-0")}
        answer = fuzz_node.prepare([("default", "c", uid)]).claims[uid]
        assert answer.error and "internal error" not in answer.error, answer.error
