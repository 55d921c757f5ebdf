"""kill -9 at every failpoint of prepare and unprepare, then restart and let the kubelet retry.

Each case starts the agent with ``DRA_AGENT_FAILPOINTS=<point>=kill``, drives the call that
hits the point (the agent SIGKILLs itself there: no cleanup, no ``finally``), restarts it
without failpoints, repeats the call as the kubelet does, and asserts the end state exactly:
the answer, the spec files, the checkpoint; then an unprepare leaves nothing.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    PCIE_ROOT,
    AgentProcess,
    Cluster,
    NodeDirs,
    assert_answer,
    assert_nothing_left,
    assert_prepared,
    ref,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn, PluginCallError

PREPARE_POINTS = (
    "prepare-after-claim-get",
    "prepare-after-started",
    "prepare-after-spec-written",
    "prepare-after-completed",
    "prepare-before-answer",
)
UNPREPARE_POINTS = (
    "unprepare-after-started",
    "unprepare-after-spec-removed",
    "unprepare-after-completed",
    "unprepare-before-answer",
)
ENV = "DRA_AGENT_FAILPOINTS"


def test_every_failpoint_of_the_agent_is_covered() -> None:
    from agent.common.failpoints import ENV as AGENT_ENV
    from agent.common.failpoints import Point
    from tests.passthrough.test_kill import PASSTHROUGH_POINTS  # GPUs for VMs, killed there
    from tests.prepare.test_host_undo_kill import HOST_POINTS  # VFs' and time slices'
    from tests.prepare.test_mig_kill import MIG_POINTS  # dynamic MIG's, killed there

    assert AGENT_ENV == ENV
    assert {p.value for p in Point} == set(PREPARE_POINTS + UNPREPARE_POINTS + MIG_POINTS
                                           + HOST_POINTS + PASSTHROUGH_POINTS)


def start_with_failpoint(start_agent: StartAgent, kubelet: KubeletStandIn,
                         point: str) -> AgentProcess:
    since = len(kubelet.registrations)
    agent = start_agent(env={ENV: f"{point}=kill"}, name=point)
    wait_registered(kubelet, since)
    return agent


def restart(start_agent: StartAgent, kubelet: KubeletStandIn) -> AgentProcess:
    since = len(kubelet.registrations)
    agent = start_agent(name="restarted")
    wait_registered(kubelet, since)
    return agent


def assert_killed_at(agent: AgentProcess, point: str) -> None:
    code = agent.wait_exit()
    logs = agent.logs()
    assert code == -signal.SIGKILL, f"exit {code}, not SIGKILL at {point}:\n{logs}"
    assert "failpoint hit" in logs and point in logs, logs


def pair_claim(cluster: Cluster) -> dict[str, Any]:
    claim = cluster.create_claim("victim", [("gpu", GPU_CLASS), ("nic", NIC_CLASS)],
                                 match_attribute=PCIE_ROOT)
    return cluster.allocate(claim)


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_kill_during_prepare_then_retry(
    point: str, dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent,
    kubelet: KubeletStandIn,
) -> None:
    doomed = start_with_failpoint(start_agent, kubelet, point)
    claim = pair_claim(cluster)
    uid = claim["metadata"]["uid"]
    with pytest.raises(PluginCallError):
        kubelet.prepare(DRIVER, [ref(claim)])
    assert_killed_at(doomed, point)

    agent = restart(start_agent, kubelet)
    result = kubelet.prepare(DRIVER, [ref(claim)])[uid]
    assert_answer(claim, result)
    assert_prepared(dirs, claim)
    recovered_spec = json.loads(dirs.spec_path(uid).read_text())

    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    # The spec written after the crash is the one a clean prepare writes.
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert json.loads(dirs.spec_path(uid).read_text()) == recovered_spec
    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    assert agent.terminate() == 0


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_kill_during_unprepare_then_retry(
    point: str, dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent,
    kubelet: KubeletStandIn,
) -> None:
    doomed = start_with_failpoint(start_agent, kubelet, point)
    claim = pair_claim(cluster)
    uid = claim["metadata"]["uid"]
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert_prepared(dirs, claim)
    with pytest.raises(PluginCallError):
        kubelet.unprepare(DRIVER, [ref(claim)])
    assert_killed_at(doomed, point)

    agent = restart(start_agent, kubelet)
    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    # Nothing of the claim stays reserved: it prepares again and cleans up again.
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert_prepared(dirs, claim)
    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    assert agent.terminate() == 0
