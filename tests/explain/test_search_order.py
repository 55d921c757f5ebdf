"""The search must find what the scheduler finds: its depth-first order is lexicographic over
(combination for request 1, combination for request 2, ...) in device order, and constraints
only prune dead ends, so the first valid tuple of a brute-force enumeration is the answer."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.explain import explain
from tests.explain.builders import CLASSES, DRIVER, NODE, allocated, claim, exactly, slice_

ROOTS = ["pci0000:15", "pci0000:40", "pci0000:a0"]

devices_st = st.lists(st.tuples(st.sampled_from(["gpu", "nic"]), st.sampled_from(ROOTS),
                                st.booleans()), min_size=1, max_size=7)
requests_st = st.lists(st.tuples(st.sampled_from(["gpu", "nic"]), st.integers(1, 2)),
                       min_size=1, max_size=3)


def brute_force(devs, reqs, match, distinct):
    free = [i for i, (_, _, busy) in enumerate(devs) if not busy]
    options = []
    for kind, count in reqs:
        ok = [i for i in free if devs[i][0] == kind]
        options.append(list(itertools.combinations(ok, count)))
    for choice in itertools.product(*options):
        flat = [i for combo in choice for i in combo]
        if len(set(flat)) != len(flat):
            continue
        roots = [devs[i][1] for i in flat]
        if match and len(set(roots)) > 1:
            continue
        if distinct and len(set(roots)) != len(roots):
            continue
        return flat
    return None


@settings(max_examples=120, deadline=None)
@given(devices_st, requests_st, st.sampled_from([None, "match", "distinct"]))
def test_first_solution_matches_brute_force(devs, reqs, constraint):
    slice_devs = [{"name": f"d{i}", "attributes": {
        "type": {"string": kind}, "resource.kubernetes.io/pcieRoot": {"string": root}}}
        for i, (kind, root, _) in enumerate(devs)]
    requests = [exactly(f"r{j}", f"{kind}.dra-agent.io", count)
                for j, (kind, count) in enumerate(reqs)]
    constraints = None
    if constraint == "match":
        constraints = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    elif constraint == "distinct":
        constraints = [{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}]
    busy = [f"d{i}" for i, (_, _, b) in enumerate(devs) if b]
    held = [allocated("other", *busy)] if busy else []
    result = explain(claim(*requests, constraints=constraints), CLASSES, [slice_(slice_devs)],
                     NODE, held)
    want = brute_force(devs, reqs, constraint == "match", constraint == "distinct")
    if want is None:
        assert not result.fits
        assert result.suggestion
    else:
        assert result.fits
        got = [r["device"] for r in result.allocation["devices"]["results"]]
        assert got == [f"d{i}" for i in want]
        assert all(r["driver"] == DRIVER for r in result.allocation["devices"]["results"])
