"""The kubelet's own plugin manager (bin/<minor>/kubelet-dra) on registrations that fail, with
the stand-in's scripted plugin (tests/kubelet/plugin.py) on the other end: what 1.35 and 1.37
do after a failed RegisterPlugin and after a failed NotifyRegistrationStatus(true), which the
stand-in plays per ``minor`` (tests/kubelet/test_registration.py has the same cases)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.harness import NodeDirs
from tests.kubelet.plugin import FakePlugin
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartKubelet
from tests.realk8s.kubelet import KubeletDRA
from tests.waiting import wait_for

DRIVER = "gpu.example.com"


@pytest.fixture
def plugins() -> Iterator[list[FakePlugin]]:
    started: list[FakePlugin] = []
    yield started
    for plugin in started:
        plugin.stop()


def instances(kubelet: KubeletDRA) -> list[dict[str, Any]]:
    return [p for p in kubelet.plugins() if p["driver"] == DRIVER]


def statuses_after(plugin: FakePlugin, seconds: float) -> list[tuple[bool, str]]:
    time.sleep(seconds)
    with plugin.cond:
        return list(plugin.statuses)


@pytest.mark.versioned  # 1.35 never retries, 1.37 backs off
def test_a_second_socket_on_a_registered_endpoint(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_kubelet: StartKubelet,
    plugins: list[FakePlugin], minor: str,
) -> None:
    """The DRA handler refuses a second registration of one endpoint. 1.35 tells the plugin
    once and never retries; 1.37 removes it from its actual state and retries with back-off
    (the plugin answers the notice with an error, as the Go helper does), so the second socket
    registers as soon as the first one is gone."""
    kubelet = start_kubelet(cluster.node_kubeconfig(node), node)
    first = FakePlugin(dirs.kubelet, DRIVER)
    plugins.append(first)
    first.start()
    wait_for(lambda: instances(kubelet), timeout=20, what="the first registration")
    assert first.wait_status(timeout=5) == [(True, "")]

    second = FakePlugin(dirs.kubelet, DRIVER, reg_name=f"{DRIVER}-other-reg.sock",
                        endpoint=str(first.dra_socket))
    plugins.append(second)
    second.start_registration()
    (refused, *_) = second.wait_status(timeout=10)
    assert not refused[0] and "already registered" in refused[1], refused
    # The kubelet's own view: one instance, the first.
    (held,) = instances(kubelet)
    assert held["endpoint"] == str(first.dra_socket) and held["service"] == "v1.DRAPlugin"
    seen = statuses_after(second, 4)  # 1.37's back-off: 0.5 s, 1 s, 2 s
    if minor == "1.35":
        assert seen == [refused]  # never retried
    else:
        assert len(seen) >= 3 and all(not ok and "already registered" in e for ok, e in seen)

    first.stop_registration()
    wait_for(lambda: not instances(kubelet), timeout=20, what="the first one deregistered")
    if minor == "1.35":
        # Nothing retries the second socket until it is re-created.
        assert statuses_after(second, 3) == seen and instances(kubelet) == []
    else:
        wait_for(lambda: instances(kubelet), timeout=20,
                 what="the retry registering the second socket")
        assert second.wait_status(len(seen) + 1, timeout=10)[-1] == (True, "")


@pytest.mark.versioned  # 1.35 keeps the registration, 1.37 retries
def test_a_failed_notice_of_success(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_kubelet: StartKubelet,
    plugins: list[FakePlugin], minor: str,
) -> None:
    """NotifyRegistrationStatus(true) answered with an error: 1.35 keeps the registration;
    1.37 deregisters the plugin and retries with back-off until the notice goes through."""
    kubelet = start_kubelet(cluster.node_kubeconfig(node), node)
    plugin = FakePlugin(dirs.kubelet, DRIVER)
    plugin.refuse_notices = True
    plugins.append(plugin)
    plugin.start()
    assert plugin.wait_status(timeout=20)[0] == (True, "")
    if minor == "1.35":
        assert statuses_after(plugin, 3) == [(True, "")]
        (held,) = instances(kubelet)
        assert held["endpoint"] == str(plugin.dra_socket)
        return
    assert plugin.wait_status(3, timeout=10)[:3] == [(True, "")] * 3
    # Deregistered between the retries (the back-off leaves it out most of the time).
    wait_for(lambda: not instances(kubelet), timeout=10, what="the plugin deregistered")
    with plugin.cond:  # a notice in flight is refused or accepted, never both (plugin.py)
        plugin.refuse_notices = False
    # A registration whose notice was refused still shows until the kubelet drops it: wait
    # for an accepted notice, not merely for an instance.
    wait_for(lambda: plugin.notices_accepted and instances(kubelet), timeout=20,
             what="the retry that sticks")
    count = len(plugin.statuses)
    assert statuses_after(plugin, 2)[count:] == []  # registered for good: no more notices
    (held,) = instances(kubelet)
    assert held["endpoint"] == str(plugin.dra_socket)


def test_what_the_strict_stand_in_refuses_the_kubelet_registers(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_kubelet: StartKubelet,
    plugins: list[FakePlugin],
) -> None:
    """ValidatePlugin and RegisterPlugin check the supported services only: a driver name that
    is no DNS subdomain and endpoints that are relative, missing or too long are registered
    (told so), never connected. The stand-in refuses them unless strict_registration=False
    (tests/fakes/kubelet/README.md)."""
    kubelet = start_kubelet(cluster.node_kubeconfig(node), node)
    cases = {"Not_A.DNS.Name": None, "relative.example.com": "relative/dra.sock",
             "missing.example.com": "/nonexistent/dra.sock",
             "long.example.com": "/" + "x" * 120}
    for driver, endpoint in cases.items():
        plugin = FakePlugin(dirs.kubelet, driver.lower().replace("_", "-"), endpoint=endpoint)
        plugin.driver = driver  # the sockets keep sane paths; GetInfo advertises the name
        plugins.append(plugin)
        plugin.start()
    for plugin in plugins:
        assert plugin.wait_status(timeout=20) == [(True, "")], plugin.driver
    held = {p["driver"]: p for p in kubelet.plugins()}
    assert set(held) == set(cases), held
    # The bad name has a good endpoint: the kubelet even connects to it.
    wait_for(lambda: any(p["driver"] == "Not_A.DNS.Name" and p["connected"]
                         for p in kubelet.plugins()), timeout=20, what="the connection")
    for driver, endpoint in cases.items():
        if endpoint is not None:
            assert held[driver]["endpoint"] == endpoint
            assert not held[driver]["connected"], held[driver]
