"""Hypothesis strategies for what reaches the agent from outside: ResourceClaims (as the API
server might return them, and worse), claim references in gRPC requests, opaque configs."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

DRIVER = "dra-agent.io"

#: Names that have broken path handling, logging or protocol code somewhere.
NASTY_NAMES = (
    "", ".", "..", "../", "../../etc/passwd", "a/../../b", "/abs", "x\x00y", "\x00",
    "a" * 300, " ", "UPPER", "ünïcödé", "new\nline", "tab\there", "%s%n", "${HOME}",
    "k8s.dra-agent.io-claim_x", "-", "a" * 63, "a" * 64, "\u202e", "\ud7ff",
)

names = st.one_of(st.sampled_from(NASTY_NAMES), st.text(max_size=40))
#: Claim UIDs: real ones and every nasty name, NUL bytes included (they are refused per claim
#: before any file work; test_fuzz.test_claim_uid_with_a_nul_byte_never_sticks covers it).
uids = st.one_of(st.uuids().map(str), names)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(allow_nan=True), st.text(max_size=20), st.sampled_from(NASTY_NAMES),
)
junk = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=4),
    max_leaves=10,
)


def result(devices: Sequence[str], pool: str) -> st.SearchStrategy[dict[str, Any]]:
    """One entry of status.allocation.devices.results: mostly ours, sometimes not at all."""
    return st.fixed_dictionaries(
        {
            "request": st.one_of(st.sampled_from(["gpu", "nic", "req/sub", "a/b/c"]), names),
            "driver": st.one_of(st.just(DRIVER), st.just(DRIVER),
                                st.sampled_from(["gpu.example.com", "dra.net", ""]), names),
            "pool": st.one_of(st.just(pool), st.just(pool), names),
            "device": st.one_of(st.sampled_from(list(devices)), names),
        },
        optional={
            "adminAccess": st.one_of(st.booleans(), junk),
            "shareID": st.one_of(st.uuids().map(str), names, junk),
            "tolerations": junk,
            "bindingConditions": junk,
            "consumedCapacity": junk,
        },
    )


def device_config() -> st.SearchStrategy[Any]:
    """``opaque.parameters``: our DeviceConfig with hostile values, or anything at all."""
    ours = st.fixed_dictionaries(
        {
            "apiVersion": st.one_of(st.just(f"{DRIVER}/v1alpha1"), st.just(f"{DRIVER}/v9"),
                                    names, junk),
            "kind": st.one_of(st.just("DeviceConfig"), names, junk),
        },
        optional={
            "env": st.one_of(st.dictionaries(names, st.one_of(names, junk), max_size=70), junk),
            "netdev": st.one_of(
                st.fixed_dictionaries({}, optional={
                    "move": st.one_of(st.booleans(), junk),
                    "interfaceName": st.one_of(names, junk),
                }),
                junk,
            ),
            "unknownField": junk,
        },
    )
    return st.one_of(ours, ours, junk)


def config_entry() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "source": st.one_of(st.sampled_from(["FromClaim", "FromClass"]), names),
            "opaque": st.one_of(
                st.fixed_dictionaries({
                    "driver": st.one_of(st.just(DRIVER), names),
                    "parameters": device_config(),
                }),
                junk,
            ),
        },
        optional={"requests": st.one_of(st.lists(names, max_size=3), junk)},
    )


#: Where a mutation may strike: delete the field or replace it by junk.
PATHS = (
    ("metadata",), ("metadata", "uid"), ("metadata", "name"), ("metadata", "namespace"),
    ("status",), ("status", "allocation"), ("status", "allocation", "devices"),
    ("status", "allocation", "devices", "results"), ("status", "allocation", "devices", "config"),
    ("status", "reservedFor"), ("spec",), ("kind",), ("apiVersion",),
)


def mutate(obj: dict[str, Any], path: tuple[str, ...], action: str, value: Any) -> None:
    here: Any = obj
    for key in path[:-1]:
        if not isinstance(here, dict) or key not in here:
            return
        here = here[key]
    if not isinstance(here, dict):
        return
    if action == "delete":
        here.pop(path[-1], None)
    else:
        here[path[-1]] = value


@st.composite
def claims(draw: st.DrawFn, devices: Sequence[str], pool: str) -> dict[str, Any]:
    """A v1 ResourceClaim, allocated to up to 32 results, then possibly mangled."""
    uid = draw(st.one_of(st.uuids().map(str), st.uuids().map(str), uids))
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": draw(st.one_of(st.just("claim"), names)),
                     "namespace": draw(st.one_of(st.just("default"), names)), "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {"devices": {
                "results": draw(st.lists(result(devices, pool), max_size=32)),
                "config": draw(st.lists(config_entry(), max_size=3)),
            }},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
        },
    }
    for path, action, value in draw(st.lists(
            st.tuples(st.sampled_from(PATHS), st.sampled_from(["delete", "replace"]), junk),
            max_size=2)):
        mutate(claim, path, action, copy.deepcopy(value))
    return claim


refs = st.tuples(st.one_of(st.just("default"), names), st.one_of(st.just("claim"), names), uids)
