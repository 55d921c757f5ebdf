"""The DaemonSet's surge as the controller runs it: the old agent Pod is stopped the moment the
new one is Ready. A new agent Ready on its sockets alone (before the kubelet's plugin watcher
had registered it) left the node without the driver until the watcher's next pass: on a real
node, FailedPrepareDynamicResources "DRA driver dra-agent.io is not registered". Ready now
means the kubelet has confirmed the registration, so the switch costs no call."""

from __future__ import annotations

import threading

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import DRIVER, NODE, Cluster, NodeDirs, ref, wait_for, wait_registered
from tests.fakes.kubelet import KubeletError, KubeletStandIn

#: The kubelet's plugin manager reconciles every second; a watcher twice as slow (a loaded
#: node) makes the gap between "sockets serving" and "registered" wide enough to see.
RECONCILE_S = 2.0


def test_the_old_instance_stops_only_once_the_kubelet_holds_the_new_one(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent,
) -> None:
    with KubeletStandIn(dirs.registry, api_client=cluster.server.api_client(), node_name=NODE,
                        poll_interval=RECONCILE_S) as kubelet:
        old = start_agent("--rolling-update", "--pod-uid", "pod-old", name="old")
        old_reg = wait_registered(kubelet)
        old.wait_http("/readyz")
        claim = cluster.allocate(cluster.create_claim("through-the-switch"))
        failures: list[str] = []
        calls = [0]
        stop = threading.Event()

        def churn() -> None:  # the kubelet preparing a pod's claim all along
            while not stop.is_set():
                try:
                    result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
                    if result.error:
                        failures.append(result.error)
                except KubeletError as err:
                    failures.append(str(err))
                calls[0] += 1

        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        try:
            new = start_agent("--rolling-update", "--pod-uid", "pod-new", name="new")
            new.wait_http("/readyz", timeout=30)
            # Ready: the kubelet already holds the new instance beside the old one.
            held = kubelet.held(DRIVER)
            assert [r.endpoint for r in held if r.endpoint != old_reg.endpoint], held
            assert old.terminate() == 0  # what the DaemonSet controller does now
            at_stop = calls[0]
            kubelet.wait_deregistered(DRIVER, timeout=10)
            wait_for("calls after the old instance left", lambda: calls[0] >= at_stop + 4)
        finally:
            stop.set()
            thread.join(60)
        assert failures == [], failures[:3]
        current = kubelet.registered(DRIVER)
        assert current is not None and current.endpoint != old_reg.endpoint, current
        assert kubelet.held(DRIVER) == [current]
        assert kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok
        assert new.terminate() == 0
