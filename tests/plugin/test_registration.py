"""Registration socket life cycle, socket paths and the instance lock."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc
import pytest

from agent.plugin.registration import RegistrationServer
from agent.plugin.sockets import (
    AlreadyRunningError,
    InstanceLock,
    SocketError,
    prepare_socket_path,
    socket_paths,
)
from protos.pluginregistration import api_pb2, api_pb2_grpc
from tests.fakes.kubelet import KubeletStandIn
from tests.plugnode import DRIVER, build_node
from tests.waiting import wait_for


def test_refused_registration_recreates_the_socket(short_root: Path) -> None:
    path = short_root / "r-reg.sock"
    reg = RegistrationServer(path, DRIVER, short_root / "dra.sock", timeout_s=30,
                             retry_delay_s=0.05)
    reg.start()
    try:
        with grpc.insecure_channel(f"unix://{path}") as ch:
            stub = api_pb2_grpc.RegistrationStub(ch)
            info = stub.GetInfo(api_pb2.InfoRequest(), timeout=1)
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            stub.NotifyRegistrationStatus(
                api_pb2.RegistrationStatus(plugin_registered=False, error="boom"), timeout=5)
        wait_for(lambda: reg.recreations == 1 and path.exists())
        assert not reg.registered
        with grpc.insecure_channel(f"unix://{path}") as ch:  # the new socket answers
            api_pb2_grpc.RegistrationStub(ch).GetInfo(api_pb2.InfoRequest(), timeout=1)
    finally:
        reg.stop()
    assert not path.exists()


def test_no_kubelet_in_time_recreates_the_socket_then_registers(short_root: Path) -> None:
    registry = short_root / "kubelet" / "plugins_registry"
    dra = socket.socket(socket.AF_UNIX)  # the endpoint must exist for the kubelet
    dra.bind(str(short_root / "dra.sock"))
    reg = RegistrationServer(registry / "x-reg.sock", DRIVER, short_root / "dra.sock",
                             timeout_s=0.2)
    reg.start()
    try:
        wait_for(lambda: reg.recreations >= 2)
        with KubeletStandIn(registry) as kubelet:
            kubelet.wait_registered(DRIVER)
            assert reg.wait_registered(5)
    finally:
        reg.stop()
        dra.close()


def test_restarted_plugin_registers_again(short_root: Path) -> None:
    n = build_node(short_root)
    try:
        before = len(n.kubelet.registrations)
        n.restart()
        assert len(n.kubelet.registrations) > before
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_health_service_is_advertised_when_given(short_root: Path) -> None:
    from protos.drahealth.v1alpha1 import api_pb2_grpc as health_grpc

    n = build_node(short_root)
    try:
        n.server.stop(0)
        from agent.plugin import PluginServer

        server = PluginServer(n.options, n.server.preparer, n.book,
                              health_servicer=health_grpc.DRAResourceHealthServicer())
        server.start()
        reg = n.kubelet.wait_registered(DRIVER, since=len(n.kubelet.registrations))
        assert reg.supported_versions[-1] == "v1alpha1.DRAResourceHealth"
        server.stop(0)
    finally:
        n.kubelet.stop()


def test_rolling_update_paths_carry_the_pod_uid() -> None:
    uid = "5f0c2a1e-7d3b-4c55-9a0e-2b8f6d4c1a90"
    paths = socket_paths(Path("/var/lib/kubelet"), DRIVER, uid, rolling_update=True)
    assert paths.registration.name == f"{DRIVER}-{uid}-reg.sock"
    assert paths.dra.name == f"dra-{uid}.sock"
    long_root = Path("/var/lib/" + "k" * 30)
    short = socket_paths(long_root, DRIVER, uid, rolling_update=True)
    assert uid not in short.registration.name
    assert len(os.fsencode(short.registration)) <= 107
    with pytest.raises(SocketError, match="AF_UNIX limit"):
        socket_paths(Path("/" + "x" * 120), DRIVER)
    with pytest.raises(SocketError, match="pod UID"):
        socket_paths(Path("/var/lib/kubelet"), DRIVER, None, rolling_update=True)


def test_two_rolling_update_instances_serve_side_by_side(short_root: Path) -> None:
    a = build_node(short_root, rolling_update=True, pod_uid="pod-a")
    try:
        b_server = a.new_server(pod_uid="pod-b")
        b_server.start()
        try:
            assert a.server.paths.dra != b_server.paths.dra
            wait_for(lambda: {r.endpoint for r in a.kubelet.registrations}
                     == {str(a.server.paths.dra), str(b_server.paths.dra)})
        finally:
            b_server.stop(0)
        assert a.server.paths.dra.exists()  # b removed only its own sockets
    finally:
        a.kubelet.stop()
        a.server.stop(0)


def test_stale_socket_is_replaced_but_other_files_are_not(tmp_path: Path) -> None:
    stale = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    prepare_socket_path(stale)
    assert not stale.exists()
    regular = tmp_path / "f.sock"
    regular.write_text("x")
    with pytest.raises(SocketError, match="not a socket"):
        prepare_socket_path(regular)


def test_instance_lock_names_the_holder(tmp_path: Path) -> None:
    first = InstanceLock(tmp_path / "instance.lock")
    first.acquire()
    with pytest.raises(AlreadyRunningError, match=f"pid {os.getpid()}"):
        InstanceLock(tmp_path / "instance.lock").acquire()
    first.release()
    InstanceLock(tmp_path / "instance.lock").acquire()


def test_an_instance_handing_over_keeps_serving_after_it_deregistered(short_root: Path) -> None:
    """A rolling update's old instance removes its registration socket first, then keeps its
    DRA socket serving for HANDOVER_DRAIN_S while the successor is registered: the real
    kubelet may still call it until its plugin watcher's next reconcile."""
    import threading
    import time

    from agent.plugin import HANDOVER_DRAIN_S
    from protos.dra.v1 import api_pb2 as dra_pb2
    from protos.dra.v1 import api_pb2_grpc as dra_grpc

    a = build_node(short_root, rolling_update=True, pod_uid="pod-a")
    b_server = a.new_server(pod_uid="pod-b")
    b_server.start()
    try:
        wait_for(lambda: len(a.kubelet.registrations) == 2, what="both instances registered")
        started = time.monotonic()
        stopping = threading.Thread(target=a.server.stop, args=(10.0,))
        stopping.start()
        wait_for(lambda: not a.server.paths.registration.exists(), what="a deregistered")
        with grpc.insecure_channel(f"unix://{a.server.paths.dra}") as channel:
            answer = dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[]), timeout=5)
        assert not answer.claims  # served, after deregistering
        stopping.join(timeout=30)
        assert not stopping.is_alive()
        assert time.monotonic() - started >= HANDOVER_DRAIN_S
        assert not a.server.paths.dra.exists()
        # Alone, an instance stops at once: nothing to hand over to.
        started = time.monotonic()
        b_server.stop(10.0)
        assert time.monotonic() - started < HANDOVER_DRAIN_S
    finally:
        a.kubelet.stop()
        b_server.stop(0)
        a.server.stop(0)
