"""The agent beside a Go driver on the upstream kubeletplugin helper, in one run.

What users compare the agent with is not our floor but the driver they would run instead: every
peer driver is a Go program on k8s.io/dynamic-resource-allocation's ``kubeletplugin`` helper and
``resourceslice`` controller. ``hack/realk8s/bin/1.37/peer-driver`` is one (the example driver's
way of preparing: a CDI spec per claim with the CDI library, a checkpoint through the kubelet's
checkpointmanager), publishing the same simulated dgx-h100 devices under the driver name
``peer.dra-agent.io``.

Both run on one node of a real kube-apiserver with the node's own credentials, registered with
the same kubelet: ``kubelet-dra``, the kubelet's own DRA manager (``pkg/kubelet/cm/dra``), which
prepares and unprepares pods of 1-GPU claims and of 8-GPU claims of each driver, interleaved
call by call (who goes first alternates per round), so both see the same API server, kubelet
and machine load. Each row prints ours, theirs and the ratio; the verdicts are the ratios.

The agent runs with --no-device-metadata and --no-health: the peer does neither (as
dra-example-driver), so both do the same work per call.

Then the same through the kubelet stand-in (tests/fakes/kubelet: the gRPC call alone, without
the kubelet's claim cache), and 16 callers at once on 16 one-device claims per driver
(throughput, and each process's peak resident memory while they run).

At rest, the slice writes of each in a 10 s window; then each driver's slices deleted as the
kubelet deletes them at its start, and the time until they are all back.

Also timed per driver, from the process start: the registration socket answering GetInfo,
and its slices complete in the API server; and each process's resident memory once idle. Ours
starts on the node layout (the simulated tree written beforehand, ``hack.benches.nodestart``);
the command as it is, writing the tree itself, is one information row ("sim. tree").
Our bytecode is compiled first, as the image's ``pip install`` compiles it: an editable
checkout under PYTHONDONTWRITEBYTECODE=1 would compile every module at each start.

Publishing N devices (8, 128, 2,048) for a node, on a second API server that writes an audit
log: ``peer-slices`` (the upstream resourceslice controller alone) and ``python -m
hack.benches.publisher`` (the agent's agent/slices alone), each its own process under its own
node's credentials, started afresh for each publish (a driver publishes at its start), idle
with no devices until the audit log shows its slice watch, then told to publish N devices: the
time until a watch shows every slice of the pool, and the requests that node's identity sent
for it (counted in the audit log, so both sides are counted alike); then stopped, and its
slices deleted by the admin. Interleaved per size, who goes first alternating per round.

Skipped with one line when the binaries are not built (``hack/realk8s/build.sh 1.37``).

The parts: ``node`` (both drivers on one node, through the kubelet), ``standin`` (through the
kubelet stand-in), ``publish`` (the slice publishers alone); ``common`` what they share.
"""

from __future__ import annotations

import os

from hack.benches import Figure, compiled, percentile
from hack.benches.vsupstream.common import (
    AT_REST_S,
    IDLE_RSS_GOAL,
    MINOR,
    RATIO_GOAL,
    START_GOAL,
    WIPE_TIMEOUT_S,
    ratio,
)
from hack.benches.vsupstream.node import measure
from hack.benches.vsupstream.publish import publish_figures


def run(quick: bool) -> list[Figure]:
    from tests.realk8s.cluster import bin_dir

    missing = [b for b in ("etcd", "kube-apiserver", "kubelet-dra", "allocate", "peer-driver",
                           "peer-slices")
               if not (bin_dir(MINOR) / b).is_file()]
    if missing:
        print(f"# vs-upstream: skipped, hack/realk8s/bin/{MINOR} lacks {', '.join(missing)}: "
              f"build it with hack/realk8s/build.sh {MINOR}")
        return []
    if os.environ.get("REALK8S_VERSION", MINOR) != MINOR:
        print(f"# vs-upstream: runs against {MINOR} only (REALK8S_VERSION is ignored)")
    os.environ["REALK8S_VERSION"] = MINOR
    compiled()  # as installed: the agent's start does not compile its sources
    times, facts = measure(3 if quick else 12)
    figures: list[Figure] = []
    for size in ("1-device", "8-device", "stand-in"):
        for op in ("prepare", "unprepare"):
            ours, theirs = times[("ours", size, op)], times[("theirs", size, op)]
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                a, b = percentile(ours, q) * 1e3, percentile(theirs, q) * 1e3
                figures += [
                    Figure(f"vs-upstream {op} {size} {name}: ours", a, "ms"),
                    Figure(f"vs-upstream {op} {size} {name}: Go helper", b, "ms"),
                    ratio(f"vs-upstream {op} {size} {name}", a, b),
                ]
    for what in ("registration", "slices"):
        a, b = facts[f"ours {what}"], facts[f"theirs {what}"]
        # Ours on the node layout: the simulated dgx-h100 sysfs tree written beforehand, as a
        # node's /sys is there before the agent starts; the peer reads a devices file.
        figures += [
            Figure(f"vs-upstream start -> {what} (node layout): ours", a, "s"),
            Figure(f"vs-upstream start -> {what}: Go helper", b, "s"),
            ratio(f"vs-upstream start -> {what} (node layout)", a, b,
                  START_GOAL if what == "registration" else RATIO_GOAL),
        ]
    # Information: the command as it is, --simulate writing that tree (about 1,500 files)
    # before discovery reads it, a cost no node pays.
    a, b = facts["ours registration (sim. tree)"], facts["theirs registration"]
    figures += [
        Figure("vs-upstream start -> registration (sim. tree): ours", a, "s"),
        Figure("vs-upstream start -> registration (sim. tree): ours / Go", a / b if b else 0.0,
               "x"),
    ]
    a, b = facts["ours wipe -> restored"], facts["theirs wipe -> restored"]
    figures += [
        Figure("vs-upstream kubelet wipe -> restored: ours", a, "s"),
        Figure("vs-upstream kubelet wipe -> restored: Go helper", b, "s",
               None if b < WIPE_TIMEOUT_S else f"timed out at {WIPE_TIMEOUT_S:.0f} s"),
        ratio("vs-upstream wipe -> restored", a, b),
    ]
    a, b = facts["ours writes at rest"], facts["theirs writes at rest"]
    figures += [
        Figure(f"vs-upstream slice writes in {AT_REST_S:.0f} s at rest: ours", a, "writes",
               f"<= Go's ({b:.0f})", a <= b),
        Figure(f"vs-upstream slice writes in {AT_REST_S:.0f} s at rest: Go helper", b,
               "writes"),
    ]
    a, b = facts["ours parallel claims/s"], facts["theirs parallel claims/s"]
    figures += [
        Figure("vs-upstream prepare+unprepare, 16 parallel callers: ours", a, "claims/s"),
        Figure("vs-upstream prepare+unprepare, 16 parallel callers: Go helper", b, "claims/s"),
        ratio("vs-upstream 16 parallel callers throughput", a, b, throughput=True),
    ]
    for what in ("1 caller", "16 callers"):
        # Each process's CPU (all its threads) per claim prepared and unprepared through
        # the stand-in: the driver's own work, apart from its waits on the disk and the API.
        a, b = facts[f"ours CPU per claim, {what}"], facts[f"theirs CPU per claim, {what}"]
        figures += [
            Figure(f"vs-upstream CPU per prepare+unprepare, {what}: ours", a * 1e3, "ms"),
            Figure(f"vs-upstream CPU per prepare+unprepare, {what}: Go helper", b * 1e3, "ms"),
            ratio(f"vs-upstream CPU per prepare+unprepare, {what}", a, b),
        ]
    for what in ("idle RSS", "RSS after calls", "RSS under 16 callers"):
        a, b = facts[f"ours {what}"], facts[f"theirs {what}"]
        figures += [
            Figure(f"vs-upstream {what}: ours", a, "MiB"),
            Figure(f"vs-upstream {what}: Go helper", b, "MiB"),
            ratio(f"vs-upstream {what}", a, b,
                  IDLE_RSS_GOAL if what == "idle RSS" else RATIO_GOAL),
        ]
    figures.append(Figure("vs-upstream calls per row", len(times[("ours", "1-device",
                                                                   "prepare")]), "calls"))
    figures += publish_figures(1 if quick else 3)
    return figures
