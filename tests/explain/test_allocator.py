"""Allocation semantics on hand-built slices: what the scheduler would pick, and why not."""

import uuid
from typing import Any

from agent.explain import explain
from tests.explain.builders import (
    CLASSES,
    DRIVER,
    NODE,
    allocated,
    claim,
    device,
    device_class,
    dgx_slice,
    exactly,
    slice_,
)

PCIE = "resource.kubernetes.io/pcieRoot"


def picks(result):
    return [(r["request"], r["device"]) for r in result.allocation["devices"]["results"]]


def reason(result, request, device):
    report = next(r for r in result.requests if r.request == request)
    verdict = next(v for v in report.devices if v.device == device)
    return verdict.reason


def test_gpu_and_nic_under_one_pcie_root_skip_a_root_with_a_busy_gpu():
    c = claim(exactly("gpu"), exactly("nic", "nic.dra-agent.io"),
              constraints=[{"matchAttribute": PCIE, "requests": ["gpu", "nic"]}])
    r = explain(c, CLASSES, [dgx_slice()], NODE, [allocated("train-0", "gpu-0")])
    assert r.fits
    assert picks(r) == [("gpu", "gpu-1"), ("nic", "nic-1")]
    assert r.allocation["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    assert reason(r, "gpu", "gpu-0").message == "allocated to claim default/train-0"
    assert reason(r, "nic", "nic-0").code == "constraint"
    assert "gpu-1 chosen for request gpu" in reason(r, "nic", "nic-0").message
    assert reason(r, "gpu", "nic-0").code == "selector"


def test_match_attribute_works_across_drivers_and_unqualified_names_use_the_driver_domain():
    other = slice_([{"name": "eth0", "attributes": {PCIE: {"string": "pci0000:40"},
                                                    "kind": {"string": "nic"}}}],
                   pool="nics", driver="net.example.com")
    net = device_class("net", 'device.driver == "net.example.com"')
    c = claim(exactly("gpu"), exactly("nic", "net"),
              constraints=[{"matchAttribute": PCIE}])
    r = explain(c, [*CLASSES, net], [dgx_slice(), other], NODE)
    assert picks(r) == [("gpu", "gpu-1"), ("nic", "eth0")]
    c = claim(exactly("a"), exactly("b"),
              constraints=[{"matchAttribute": f"{DRIVER}/numa"}])
    r = explain(c, CLASSES, [dgx_slice()], NODE, [allocated("x", "gpu-1")])
    assert picks(r) == [("a", "gpu-2"), ("b", "gpu-3")]  # numa 0 has one free GPU left


def test_distinct_attribute_spreads_requests():
    c = claim(exactly("a"), exactly("b"), constraints=[{"distinctAttribute": f"{DRIVER}/numa"}])
    r = explain(c, CLASSES, [dgx_slice()], NODE)
    assert picks(r) == [("a", "gpu-0"), ("b", "gpu-2")]
    assert "distinctAttribute" in reason(r, "b", "gpu-1").message


def test_mig_profiles_selected_by_memory():
    migs = [device(f"gpu-0-mig-{p}", "mig", "pci0000:15", mem)
            for p, mem in (("1g10gb", "9728Mi"), ("2g20gb", "19968Mi"), ("3g40gb", "40192Mi"))]
    c = claim(exactly("m", "mig.dra-agent.io", 1,
                      f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) >= 0'))
    r = explain(c, CLASSES, [slice_(migs)], NODE)
    assert picks(r) == [("m", "gpu-0-mig-3g40gb")]
    assert "compareTo" in reason(r, "m", "gpu-0-mig-2g20gb").detail["failing"]


def test_exact_count_takes_devices_in_search_order():
    r = explain(claim(exactly("gpu", count=3)), CLASSES, [dgx_slice()], NODE)
    assert [d for _, d in picks(r)] == ["gpu-0", "gpu-1", "gpu-2"]


def test_all_mode_takes_every_matching_device_and_fails_when_one_is_busy():
    c = claim(exactly("gpu", allocationMode="All"))
    r = explain(c, CLASSES, [dgx_slice()], NODE)
    assert [d for _, d in picks(r)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    r = explain(c, CLASSES, [dgx_slice()], NODE, [allocated("train-0", "gpu-3")])
    assert not r.fits
    assert "allocated to claim default/train-0" in r.suggestion


def test_first_available_falls_back_in_order_and_names_the_subrequest():
    c = claim({"name": "gpu", "firstAvailable": [
        {"name": "many", "deviceClassName": "gpu.dra-agent.io", "count": 8},
        {"name": "two", "deviceClassName": "gpu.dra-agent.io", "count": 2},
        {"name": "one", "deviceClassName": "gpu.dra-agent.io"}]},
        config=[{"requests": ["gpu/two"], "opaque": {"driver": DRIVER,
                                                     "parameters": {"sharing": "none"}}}])
    r = explain(c, CLASSES, [dgx_slice()], NODE)
    assert picks(r) == [("gpu/two", "gpu-0"), ("gpu/two", "gpu-1")]
    status = {x.request: x.status for x in r.requests}
    assert status == {"gpu/many": "unsatisfied", "gpu/two": "allocated", "gpu/one": "skipped"}
    assert r.allocation["devices"]["config"] == [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"sharing": "none"}}}]


def test_admin_access_may_use_allocated_devices_and_does_not_block_others():
    c = claim(exactly("mon", count=4, adminAccess=True))
    busy = [allocated("train-0", "gpu-0", "gpu-1")]
    r = explain(c, CLASSES, [dgx_slice()], NODE, busy)
    assert r.fits and len(picks(r)) == 4
    assert all(x.get("adminAccess") is True for x in r.allocation["devices"]["results"])
    admin_held = [allocated("mon", "gpu-0", "gpu-1", "gpu-2", "gpu-3", admin=True)]
    assert explain(claim(exactly("gpu", count=4)), CLASSES, [dgx_slice()], NODE,
                   admin_held).fits


def test_taints_block_unless_tolerated_and_none_effect_is_ignored():
    devs = [device("gpu-0"), device("gpu-1", root="pci0000:40")]
    devs[0]["taints"] = [{"key": "dra-agent.io/unhealthy", "value": "xid-79",
                          "effect": "NoSchedule"}]
    devs[1]["taints"] = [{"key": "info", "effect": "None"}]
    r = explain(claim(exactly("gpu", count=2)), CLASSES, [slice_(devs)], NODE)
    assert not r.fits
    assert reason(r, "gpu", "gpu-0").message == \
        "taint dra-agent.io/unhealthy=xid-79:NoSchedule not tolerated"
    tol = [{"key": "dra-agent.io/unhealthy", "operator": "Exists"}]
    r = explain(claim(exactly("gpu", count=2, tolerations=tol)), CLASSES, [slice_(devs)], NODE)
    assert r.fits
    assert r.allocation["devices"]["results"][0]["tolerations"] == tol


def counter_slices():
    counters = [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}]
    migs = []
    for i in range(3):
        d = device(f"gpu-0-mig-{i}", "mig", memory="20Gi")
        d["consumesCounters"] = [{"counterSet": "gpu-0",
                                  "counters": {"memory": {"value": "20Gi"}}}]
        migs.append(d)
    return [slice_([], name="a-counters", counters=counters, count=2),
            slice_(migs, name="b-devices", count=2)]


def test_shared_counters_limit_partitions():
    slices = counter_slices()
    assert explain(claim(exactly("m", "mig.dra-agent.io", 2)), CLASSES, slices, NODE).fits
    r = explain(claim(exactly("m", "mig.dra-agent.io", 3)), CLASSES, slices, NODE)
    assert not r.fits
    assert reason(r, "m", "gpu-0-mig-2").code == "counters"
    r = explain(claim(exactly("m", "mig.dra-agent.io", 2)), CLASSES, slices, NODE,
                [allocated("other", "gpu-0-mig-0")])
    assert not r.fits
    assert reason(r, "m", "gpu-0-mig-0").code == "allocated"
    assert reason(r, "m", "gpu-0-mig-1") is None
    assert reason(r, "m", "gpu-0-mig-2").message == (
        "counter gpu-0/memory: needs 20Gi, 0 left (taken by gpu-0-mig-0, gpu-0-mig-1)")


def vf_like_slices(count: int = 24) -> list[dict[str, Any]]:
    """``count`` identical devices, each taking a quarter of one counter: four fit."""
    counters = [{"name": "link", "counters": {"bandwidth": {"value": "100G"}}}]
    vfs = []
    for i in range(count):
        d = device(f"gpu-{i}", memory=None)
        d["consumesCounters"] = [{"counterSet": "link",
                                  "counters": {"bandwidth": {"value": "25G"}}}]
        vfs.append(d)
    return [slice_([], name="a-counters", counters=counters, count=2),
            slice_(vfs, name="b-devices", count=2)]


def test_a_search_past_the_filter_timeout_gives_up_as_the_scheduler_does():
    # Five of 24 where four fit: every 4-subset is tried before the fifth fails (upstream
    # too, which stops at its 10 s filter timeout). A clock that ticks once per look.
    ticks = iter(range(10**9))
    r = explain(claim(exactly("gpu", count=5)), CLASSES, vf_like_slices(), NODE,
                timeout_s=3, clock=lambda: float(next(ticks)))
    assert not r.fits and r.error is not None
    assert r.error.startswith("timed out after 3s: the scheduler's filter gives up this "
                              "search then and the node is unschedulable for the pod (")
    assert next(ticks) == 5  # the start, then four looks: gave up at the first one past 3
    # Without a timeout the same search ends, only later; four fit either way.
    assert not explain(claim(exactly("gpu", count=5)), CLASSES, vf_like_slices(8), NODE,
                       timeout_s=None).fits
    assert explain(claim(exactly("gpu", count=4)), CLASSES, vf_like_slices(), NODE).fits


def test_only_the_newest_complete_generation_counts():
    old = slice_([device("gpu-0"), device("gpu-9")], generation=1, name="old")
    new = slice_([device("gpu-0")], generation=2, name="new")
    r = explain(claim(exactly("gpu", count=2)), CLASSES, [old, new], NODE)
    assert not r.fits and [p.generation for p in r.pools] == [2]
    half = slice_([device("gpu-0")], generation=3, count=2, name="half")
    r = explain(claim(exactly("gpu")), CLASSES, [old, half], NODE)
    assert not r.fits and r.pools[0].status == "incomplete"
    r = explain(claim(exactly("gpu", allocationMode="All")), CLASSES, [half], NODE)
    assert r.error and "being updated" in r.error


def test_search_order_is_driver_then_pool_then_slice_name():
    b = slice_([device("x")], driver="b.io", pool="p", name="s1")
    a2 = slice_([device("y")], driver="a.io", pool="p", name="s2", count=2)
    a1 = slice_([device("z")], driver="a.io", pool="p", name="s1", count=2)
    anyc = device_class("any", "true")
    r = explain(claim(exactly("d", "any", 3)), [anyc], [b, a2, a1], NODE)
    assert [(x["driver"], x["device"]) for x in r.allocation["devices"]["results"]] == [
        ("a.io", "z"), ("a.io", "y"), ("b.io", "x")]


def test_backtracking_gives_a_later_request_the_device_it_needs():
    c = claim(exactly("any"), exactly("first", "gpu.dra-agent.io", 1,
                                      f'device.attributes["{DRIVER}"].numa == 0'),
              exactly("second", "gpu.dra-agent.io", 1,
                      f'device.attributes["{DRIVER}"].numa == 0'))
    r = explain(c, CLASSES, [dgx_slice()], NODE)
    assert picks(r) == [("any", "gpu-2"), ("first", "gpu-0"), ("second", "gpu-1")]


def test_consumable_capacity_shares_a_device():
    dev = {"name": "nic-0", "allowMultipleAllocations": True,
           "attributes": {"type": {"string": "nic"}},
           "capacity": {"bandwidth": {"value": "100G", "requestPolicy": {
               "default": "10G", "validRange": {"min": "10G", "step": "10G"}}}}}
    held = allocated("a", "nic-0", shareID=str(uuid.uuid4()),
                     consumedCapacity={"bandwidth": "70G"})
    big = claim(exactly("n", "nic.dra-agent.io", capacity={"requests": {"bandwidth": "35G"}}))
    r = explain(big, CLASSES, [slice_([dev])], NODE, [held])
    assert not r.fits
    assert reason(r, "n", "nic-0").message == "bandwidth: needs 40G, 30G of 100G left"
    small = claim(exactly("n", "nic.dra-agent.io", capacity={"requests": {"bandwidth": "25G"}}))
    r = explain(small, CLASSES, [slice_([dev])], NODE, [held], share_ids=lambda: "share-1")
    result = r.allocation["devices"]["results"][0]
    assert result["shareID"] == "share-1" and result["consumedCapacity"] == {"bandwidth": "30G"}


def test_class_and_claim_config_land_in_the_allocation():
    cls = device_class("gpu.dra-agent.io", f'device.attributes["{DRIVER}"].type == "gpu"',
                       config=[{"driver": DRIVER, "parameters": {"mode": "exclusive"}}])
    c = claim(exactly("a"), exactly("b"),
              config=[{"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}])
    r = explain(c, [cls], [dgx_slice()], NODE)
    assert r.allocation["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"mode": "exclusive"}}},
        {"source": "FromClaim", "requests": ["b"],
         "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}]


def test_selector_runtime_error_stops_like_the_scheduler():
    c = claim(exactly("x", "any", 1, f'device.attributes["{DRIVER}"].productName == "H100"'))
    r = explain(c, [device_class("any", "true")], [dgx_slice()], NODE)
    assert not r.fits and "no such key: productName" in r.error
    assert reason(r, "x", "gpu-0").code == "selector-error"
    assert "has(" in r.suggestion


def test_impossible_counts_say_how_many_match():
    r = explain(claim(exactly("gpu", count=5)), CLASSES, [dgx_slice()], NODE)
    assert not r.fits
    assert r.suggestion.startswith("request gpu needs 5 device(s) of class gpu.dra-agent.io "
                                   "but only 4 match")
    r = explain(claim(exactly("gpu", count=3)), CLASSES, [dgx_slice()], NODE,
                [allocated("train-0", "gpu-1"), allocated("train-1", "gpu-3")])
    assert r.suggestion == ("request gpu: 2 of 3 device(s) that match are free; the third, "
                            "gpu-1 under pci0000:40, is not: allocated to claim default/train-0")


def test_too_many_devices_for_one_allocation():
    devs = [device(f"gpu-{i}") for i in range(40)]
    r = explain(claim(exactly("gpu", count=33)), CLASSES, [slice_(devs)], NODE)
    assert not r.fits and "at most 32" in r.error


def test_other_nodes_slices_are_ignored_and_the_claim_itself_is_not_a_holder():
    mine = dgx_slice()
    theirs = slice_([device("gpu-x")], node="node-b", pool="node-b")
    c = claim(exactly("gpu", count=4))
    myself = allocated("job", "gpu-0")
    r = explain(c, CLASSES, [mine, theirs], NODE, [myself])
    assert r.fits and "gpu-x" not in [d for _, d in picks(r)]


def test_constraints_may_name_subrequests():
    c = claim({"name": "gpu", "firstAvailable": [
        {"name": "pair", "deviceClassName": "gpu.dra-agent.io", "count": 2},
        {"name": "one", "deviceClassName": "gpu.dra-agent.io"}]},
        exactly("nic", "nic.dra-agent.io"),
        constraints=[{"matchAttribute": PCIE, "requests": ["gpu/pair", "gpu/one", "nic"]}])
    r = explain(c, CLASSES, [dgx_slice()], NODE)
    # No root holds two GPUs, so the pair fails the constraint and "one" is used.
    assert picks(r) == [("gpu/one", "gpu-0"), ("nic", "nic-0")]


def test_an_incomplete_pool_is_named_in_the_suggestion():
    half = slice_([device("gpu-0")], count=2, name="half")
    r = explain(claim(exactly("gpu")), CLASSES, [half], NODE)
    assert not r.fits
    assert r.pools[0].message == "1 of 2 slices at generation 0"
    assert r.suggestion.startswith(f"pool {DRIVER}/{NODE} is incomplete (1 of 2 slices")
