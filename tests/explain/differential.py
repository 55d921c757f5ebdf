"""Cases for the differential test of ``explain`` against the scheduler's own allocator.

A case is one pod's claims (one to three, allocated together) on one node with everything the
allocator sees: the node (with labels), DeviceClasses, ResourceSlices of several drivers, pools
and nodes (nodeName of this node and of another, allNodes, nodeSelector, several slices per
pool, an older generation, incomplete pools), devices with int, string, version, bool and
(with DRAListTypeAttributes) list attributes, capacities, counters and taints, and devices
other claims already hold. Claims have selectors, counts,
``All``, ``firstAvailable``, matchAttribute/distinctAttribute, adminAccess, tolerations,
consumable capacity and config; they are written as the API server stores them (defaults
filled in), since the allocator reads them so.

``cases(features)`` is the hypothesis strategy; ``allocator_doc`` is the allocate tool's
input line; ``explain_case`` runs ``explain``; ``answer_of``/``compare`` put both answers in
one shape and say where they differ. The real-Kubernetes suite runs the cases through
``bin/<minor>/allocate``; tests/explain/test_allocator_agreement.py replays the ones that
once disagreed, with the allocator's recorded answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hypothesis import strategies as st

from agent.explain.api import explain_pod
from agent.explain.result import PodExplainResult
from agent.explain.values import parse_quantity

NODE = "node-a"
OTHER_NODE = "node-b"
DRIVERS = ("a.example.com", "b.example.com")
OTHER_DOMAIN = "example.com"  # attributes not in the driver's own domain
ZONES = ("z1", "z2")
MODELS = ("a100", "h100", "l4")
VERSIONS = ("1.0.0", "1.2.0", "2.0.0-rc.1", "2.0.0")
MEMORIES = ("8Gi", "16Gi", "40Gi")


@dataclass(frozen=True)
class Features:
    """One allocator setting under test: a minor with its gates, and what the cases may use.

    Explain runs with the same minor and gates (``explain_kwargs``), so cases may use fields
    whose gate is off there: the allocator must then ignore them (or refuse the claim) as
    explain does. Where a gate is off the field is generated rarely, so most cases still test
    an allocation."""

    minor: str
    taints: bool  # DRADeviceTaints on (else taints and tolerations only now and then)
    counters: bool  # DRAPartitionableDevices on
    consumable: bool  # DRAConsumableCapacity on (also distinctAttribute)
    gates: str = ""  # --feature-gates of both, on top of the minor's defaults
    lists: bool = False  # DRAListTypeAttributes on: list-type attributes

    def explain_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that tell ``explain`` the same minor and gates."""
        return {"kubernetes_version": self.minor, "feature_gates": self.gates or None}


#: Per minor: the settings to run, the scheduler's defaults first (k8s.io/kubernetes
#: pkg/features). 1.37 also with DRAListTypeAttributes (alpha, off by default; not in 1.35).
PROFILES: dict[str, tuple[Features, ...]] = {
    "1.37": (Features("1.37", taints=True, counters=True, consumable=True),
             Features("1.37", taints=True, counters=True, consumable=True,
                      gates="DRAListTypeAttributes=true", lists=True)),
    "1.35": (Features("1.35", taints=False, counters=False, consumable=False),),
}
#: The scheduler's defaults per minor.
FEATURES = {minor: profiles[0] for minor, profiles in PROFILES.items()}


def _rare(draw: st.DrawFn, on: bool, one_in: int) -> bool:
    """One in ``one_in`` with the gate on, one in four times that with it off."""
    return draw(st.integers(1, one_in if on else 4 * one_in)) == 1


# --- CEL --------------------------------------------------------------------------------

def _has(driver: str, name: str) -> str:
    return f'"{name}" in device.attributes["{driver}"]'


def _expression(draw: st.DrawFn, driver: str) -> str:
    """One selector over the generated attributes; a few may fail at runtime (missing key)."""
    a = f'device.attributes["{driver}"]'
    kind = draw(st.sampled_from(["driver", "model", "mem", "fw", "ok", "cap", "rack", "raw",
                                 "not"]))
    if kind == "driver":
        return f'device.driver == "{draw(st.sampled_from(DRIVERS))}"'
    if kind == "model":
        return f'{_has(driver, "model")} && {a}.model == "{draw(st.sampled_from(MODELS))}"'
    if kind == "mem":
        op = draw(st.sampled_from([">=", "<", "=="]))
        return f'{_has(driver, "mem")} && {a}.mem {op} {draw(st.integers(0, 4))}'
    if kind == "fw":
        v = draw(st.sampled_from(VERSIONS))
        return f'{_has(driver, "fw")} && {a}.fw.compareTo(semver("{v}")) >= 0'
    if kind == "ok":
        return f'{_has(driver, "ok")} && {a}.ok'
    if kind == "cap":
        m = draw(st.sampled_from(MEMORIES))
        return (f'"memory" in device.capacity["{driver}"] && '
                f'device.capacity["{driver}"].memory.compareTo(quantity("{m}")) >= 0')
    if kind == "rack":
        return (f'"rack" in device.attributes["{OTHER_DOMAIN}"] && '
                f'device.attributes["{OTHER_DOMAIN}"].rack == "r1"')
    if kind == "not":
        return f'!({_has(driver, "model")} && {a}.model == "l4")'
    return f'{a}.model == "{draw(st.sampled_from(MODELS))}"'  # errors without the attribute


def _selectors(draw: st.DrawFn, driver: str, most: int) -> list[dict[str, Any]]:
    n = draw(st.integers(0, most)) if draw(st.booleans()) else 0
    return [{"cel": {"expression": _expression(draw, driver)}} for _ in range(n)]


# --- slices -----------------------------------------------------------------------------

def _device(draw: st.DrawFn, name: str, driver: str, f: Features, counter_sets: list[str]
            ) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        attrs["model"] = {"string": draw(st.sampled_from(MODELS))}
    if draw(st.booleans()):
        attrs["mem"] = {"int": draw(st.integers(0, 4))}
    if draw(st.integers(0, 3)):
        attrs["numa"] = {"int": draw(st.integers(0, 1))}
    if draw(st.booleans()):
        attrs["fw"] = {"version": draw(st.sampled_from(VERSIONS))}
    if draw(st.booleans()):
        attrs["ok"] = {"bool": draw(st.booleans())}
    if draw(st.booleans()):
        attrs[f"{OTHER_DOMAIN}/rack"] = {"string": draw(st.sampled_from(["r1", "r2"]))}
    if f.lists and draw(st.booleans()):
        kind, pool_ = draw(st.sampled_from([("ints", [0, 1, 2]), ("strings", ["x", "y", "z"])]))
        attrs["links"] = {kind: draw(st.lists(st.sampled_from(pool_), min_size=1, max_size=2,
                                              unique=True))}
    out: dict[str, Any] = {"name": name}
    if attrs:
        out["attributes"] = attrs
    shared = _rare(draw, f.consumable, 5)
    if shared:
        out["allowMultipleAllocations"] = True
        cap: dict[str, Any] = {"value": draw(st.sampled_from(MEMORIES))}
        policy = draw(st.sampled_from(["none", "default", "range", "values"]))
        if policy == "default":
            cap["requestPolicy"] = {"default": "4Gi"}
        elif policy == "range":
            cap["requestPolicy"] = {"default": "4Gi",
                                    "validRange": {"min": "2Gi", "step": "2Gi"}}
        elif policy == "values":
            cap["requestPolicy"] = {"default": "4Gi", "validValues": ["4Gi", "8Gi"]}
        out["capacity"] = {"memory": cap}
    elif draw(st.booleans()):
        out["capacity"] = {"memory": {"value": draw(st.sampled_from(MEMORIES))}}
    if _rare(draw, f.taints, 5):
        out["taints"] = [{"key": draw(st.sampled_from(["k1", "k2"])),
                          "value": draw(st.sampled_from(["", "v"])),
                          "effect": draw(st.sampled_from(["NoSchedule", "NoExecute", "None"]))}
                         for _ in range(draw(st.integers(1, 2)))]
    if counter_sets and draw(st.booleans()):
        out["consumesCounters"] = [{"counterSet": draw(st.sampled_from(counter_sets)),
                                    "counters": {"mem": {"value": str(draw(st.integers(1, 3)))}}}]
    return out


def _where(draw: st.DrawFn) -> dict[str, Any]:
    """Node selection of a slice: mostly this node, sometimes another or a selector."""
    kind = draw(st.sampled_from(["node"] * 5 + ["other", "all", "selector"]))
    if kind == "node":
        return {"nodeName": NODE}
    if kind == "other":
        return {"nodeName": OTHER_NODE}
    if kind == "all":
        return {"allNodes": True}
    return {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": [draw(st.sampled_from(ZONES))]}]}]}}


def _pool(draw: st.DrawFn, driver: str, name: str, f: Features, first: bool
          ) -> list[dict[str, Any]]:
    where = {"nodeName": NODE} if first and draw(st.integers(0, 2)) else _where(draw)
    n_slices = draw(st.integers(1, 2))
    counter_sets: list[str] = []
    slices: list[dict[str, Any]] = []
    gen = draw(st.sampled_from([0, 0, 0, 1]))
    if _rare(draw, f.counters, 3):
        counter_sets = ["cs0"] if draw(st.booleans()) else ["cs0", "cs1"]
        slices.append({"sharedCounters": [{"name": c, "counters": {"mem": {"value": str(
            draw(st.integers(1, 4)))}}} for c in counter_sets]})
    n_dev = 0
    for k in range(n_slices):
        devs = []
        for _ in range(draw(st.integers(1 if k == 0 else 0, 4))):
            devs.append(_device(draw, f"dev-{n_dev}", driver, f, counter_sets))
            n_dev += 1
        slices.append({"devices": devs})
    count = len(slices) + (1 if draw(st.integers(0, 24)) == 24 else 0)  # rarely incomplete
    out = []
    for i, body in enumerate(slices):
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": f"{driver}-{name}-{draw(st.sampled_from('abcdef'))}{i}"},
                    "spec": {"driver": driver, **where,
                             "pool": {"name": name, "generation": gen,
                                      "resourceSliceCount": count}, **body}})
    if gen == 1 and draw(st.booleans()):  # a stale slice of the previous generation
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": f"{driver}-{name}-old"},
                    "spec": {"driver": driver, **where,
                             "pool": {"name": name, "generation": 0, "resourceSliceCount": 1},
                             "devices": [{"name": "dev-old"}]}})
    return out


# --- classes and claims -----------------------------------------------------------------

def _class(draw: st.DrawFn, name: str, driver: str, f: Features) -> dict[str, Any]:
    sels: list[dict[str, Any]] = []
    if draw(st.integers(0, 3)):
        sels.append({"cel": {"expression": f'device.driver == "{driver}"'}})
    sels += _selectors(draw, driver, 1)
    spec: dict[str, Any] = {"selectors": sels} if sels else {}
    if draw(st.integers(0, 2)) == 2:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": {"class": name}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": spec}


def _exact(draw: st.DrawFn, classes: list[tuple[str, str]], f: Features, sub: bool = False
           ) -> dict[str, Any]:
    cls, driver = draw(st.sampled_from(classes))
    out: dict[str, Any] = {"deviceClassName": cls}
    sels = _selectors(draw, driver, 1)
    if sels:
        out["selectors"] = sels
    if draw(st.integers(0, 5)) == 5:
        out["allocationMode"] = "All"
    else:
        out["allocationMode"] = "ExactCount"
        out["count"] = draw(st.sampled_from([1, 1, 1, 1, 2, 2, 3]))
    if not sub and draw(st.integers(0, 7)) == 7:  # subrequests have no adminAccess
        out["adminAccess"] = True
    if _rare(draw, f.taints, 4):
        tol: dict[str, Any] = {"key": draw(st.sampled_from(["k1", "k2"]))}
        if draw(st.booleans()):
            tol["operator"] = "Exists"
        else:
            tol["operator"] = "Equal"
            if draw(st.booleans()):  # as stored: an empty value is omitted
                tol["value"] = "v"
        if draw(st.booleans()):
            tol["effect"] = draw(st.sampled_from(["NoSchedule", "NoExecute"]))
        out["tolerations"] = [tol]
    if _rare(draw, f.consumable, 4):
        out["capacity"] = {"requests": {"memory": draw(st.sampled_from(["1Gi", "4Gi", "6Gi"]))}}
    return out


@st.composite
def _claim(draw: st.DrawFn, classes: list[tuple[str, str]], f: Features,
           claim_name: str = "job") -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    names: list[str] = []
    for i in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3]))):
        name = f"r{i}"
        if draw(st.integers(0, 3)) == 3:
            subs = [{"name": f"s{j}", **_exact(draw, classes, f, sub=True)}
                    for j in range(draw(st.integers(1, 3)))]
            requests.append({"name": name, "firstAvailable": subs})
            names += [f"{name}/{s['name']}" for s in subs]
        else:
            requests.append({"name": name, "exactly": _exact(draw, classes, f)})
        names.append(name)
    devices: dict[str, Any] = {"requests": requests}
    constraints = []
    for _ in range(draw(st.integers(0, 2))):
        attrs = [f"{DRIVERS[0]}/numa", f"{DRIVERS[1]}/numa", f"{OTHER_DOMAIN}/rack",
                 f"{DRIVERS[0]}/model"] + ([f"{DRIVERS[0]}/links"] * 2 if f.lists else [])
        attr = draw(st.sampled_from(attrs))
        # distinctAttribute came with DRAConsumableCapacity (without it the allocator calls
        # the constraint empty and refuses the claim)
        kind = "distinctAttribute" if _rare(draw, f.consumable, 2) else "matchAttribute"
        c: dict[str, Any] = {kind: attr}
        refs = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
        if refs:
            c["requests"] = refs
        constraints.append(c)
    if constraints:
        devices["constraints"] = constraints
    if draw(st.integers(0, 2)) == 2:
        refs = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        cfg: dict[str, Any] = {"opaque": {"driver": DRIVERS[0], "parameters": {"claim": True}}}
        if refs:
            cfg["requests"] = refs
        devices["config"] = [cfg]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim_name, "namespace": "default",
                         "uid": f"uid-{claim_name}"},
            "spec": {"devices": devices}}


@st.composite
def cases(draw: st.DrawFn, f: Features) -> dict[str, Any]:
    """One case: ``{"node", "labels", "claims", "classes", "slices", "allocated"}``: one pod's
    claims (mostly one, up to three), allocated together."""
    slices: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):  # the first pool is the one most claims want
        driver = DRIVERS[0] if i == 0 else draw(st.sampled_from(DRIVERS))
        slices += _pool(draw, driver, f"pool-{i}", f, first=i == 0)
    slices = draw(st.permutations(slices))
    class_names = [(f"class-{i}", DRIVERS[0] if i == 0 else draw(st.sampled_from(DRIVERS)))
                   for i in range(draw(st.integers(1, 2)))]
    classes = [_class(draw, n, d, f) for n, d in class_names]
    ids = [(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])
           for s in slices for d in s["spec"].get("devices") or []]
    held = draw(st.lists(st.sampled_from(ids), max_size=draw(st.sampled_from([0, 0, 1, 2])),
                         unique=True)) if ids else []
    return {"node": NODE, "labels": {"kubernetes.io/hostname": NODE,
                                     "zone": draw(st.sampled_from(ZONES))},
            "claims": [draw(_claim(class_names, f, f"job-{i}"))
                       for i in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3])))],
            "classes": classes, "slices": slices,
            "allocated": [{"driver": d, "pool": p, "device": n} for d, p, n in held]}


# --- running both and comparing ---------------------------------------------------------

def allocator_doc(case: Mapping[str, Any], by_name: bool = False) -> str:
    """The allocate tool's input, one line; ``by_name``: the slices sorted by name (1.35's
    allocator keeps their input order within a pool, see ``exact_choice_defined``)."""
    slices = sorted(case["slices"], key=lambda s: str(s["metadata"]["name"])) if by_name \
        else case["slices"]
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": case["node"], "labels": case["labels"]}}
    return json.dumps({"node": node, "claims": claims_of(case),
                       "deviceClasses": case["classes"], "resourceSlices": slices,
                       "allocatedDevices": case["allocated"]}, separators=(",", ":"))


def claims_of(case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's claims (recorded cases of one claim have ``claim``)."""
    return list(case["claims"]) if "claims" in case else [case["claim"]]


def _held_claims(case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The allocate tool's ``allocatedDevices`` as the claims that hold them, for explain."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"held-{i}", "namespace": "default", "uid": f"uid-held-{i}"},
             "spec": {"devices": {"requests": []}},
             "status": {"allocation": {"devices": {"results": [{"request": "r", **d}]}}}}
            for i, d in enumerate(case["allocated"])]


def explain_case(case: Mapping[str, Any], f: Features) -> PodExplainResult:
    return explain_pod(claims_of(case), case["classes"], case["slices"], case["node"],
                       _held_claims(case), node_labels=case["labels"], **f.explain_kwargs())


def _quantities(raw: Mapping[str, Any] | None) -> dict[str, Fraction]:
    return {k: parse_quantity(v) for k, v in (raw or {}).items()}


def _results(allocation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each result as both write it: shareID is a fresh UUID, so only its presence counts."""
    out = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        out.append({"request": r["request"], "driver": r["driver"], "pool": r["pool"],
                    "device": r["device"], "adminAccess": bool(r.get("adminAccess")),
                    "tolerations": r.get("tolerations") or [],
                    "shared": bool(r.get("shareID")),
                    "consumedCapacity": _quantities(r.get("consumedCapacity"))})
    return out


def _answer(allocation: Mapping[str, Any]) -> dict[str, Any]:
    return {"results": _results(allocation),
            "config": (allocation.get("devices") or {}).get("config") or [],
            "nodeSelector": allocation.get("nodeSelector")}


def answer_of_allocator(reply: Mapping[str, Any], uids: Sequence[str] = ("uid-job",)
                        ) -> dict[str, Any]:
    """The allocate tool's reply in the shape ``compare`` reads: ``claims`` in pod order."""
    if reply.get("allocations"):
        return {"fits": True, "error": False,
                "claims": [_answer(reply["allocations"][u]) for u in uids]}
    return {"fits": False, "error": not reply.get("unschedulable")}


def answer_of_explain(result: PodExplainResult) -> dict[str, Any]:
    if result.fits:
        return {"fits": True, "error": False,
                "claims": [_answer(c.allocation or {}) for c in result.claims]}
    return {"fits": False, "error": result.error is not None}


def uids_of(case: Mapping[str, Any]) -> list[str]:
    return [str(c["metadata"]["uid"]) for c in claims_of(case)]


def _pools_for_node(case: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The pools with devices that the case's node sees (nodeName, allNodes, its zone)."""
    zone = case["labels"].get("zone")
    out = set()
    for s in case["slices"]:
        spec = s["spec"]
        terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
        seen = (spec.get("nodeName") == case["node"] or spec.get("allNodes")
                or any(zone in e["values"] for t in terms for e in t["matchExpressions"]))
        if seen and spec.get("devices"):
            out.add((spec["driver"], spec["pool"]["name"]))
    return out


def exact_choice_defined(case: Mapping[str, Any], minor: str) -> bool:
    """Whether the allocator of ``minor`` picks devices in a defined order for this case.

    From 1.36 on, pools are sorted by driver and name and slices by name (which explain
    mirrors). 1.35's allocator (dynamic-resource-allocation v0.35 GatherPools) walks its pools
    out of a Go map, in random order, and a pool's slices in input order: with two pools for
    the node the same input allocates from either (hypothesis flags it as flaky). There only
    the fit (and error) can be compared, and the exact choice only with one pool (its slices
    are then given sorted by name, the order explain uses)."""
    return minor != "1.35" or len(_pools_for_node(case)) <= 1


def compare(allocator: Mapping[str, Any], explained: Mapping[str, Any], exact: bool = True
            ) -> str | None:
    """None when they agree: on fit, on failing with an error (not just "no fit"), and with
    ``exact`` on the exact results in order (request, driver, pool, device, admin access,
    tolerations, shared, consumed capacity), on the config and on the node selector."""
    for key in ("fits", "error"):
        if allocator.get(key) != explained.get(key):
            return f"{key}: allocator {allocator.get(key)!r}, explain {explained.get(key)!r}"
    if not exact:
        return None
    for i, (want, got) in enumerate(zip(allocator.get("claims") or [],
                                        explained.get("claims") or [], strict=True)):
        for key in ("results", "config", "nodeSelector"):
            if want.get(key) != got.get(key):
                return (f"claim #{i} {key}: allocator {want.get(key)!r}, "
                        f"explain {got.get(key)!r}")
    return None
