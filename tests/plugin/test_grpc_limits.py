"""Bounds on the DRA gRPC server: streams cannot starve prepare, claims per call, the call's
deadline, request size. Over real unix sockets, through the kubelet stand-in."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.claim.model import ClaimNotFoundError, ClaimRef
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.health import ChangeFeed, DeviceHealth, HealthServicer
from agent.plugin.framework import MAX_CLAIMS_PER_CALL
from agent.plugin.limits import MAX_STREAMS
from discovery.model import Inventory
from protos.dra.v1 import api_pb2 as pb
from protos.dra.v1 import api_pb2_grpc as pb_grpc
from tests.fakes.kubelet import KubeletStandIn, PluginCallError
from tests.plugnode import (
    DRIVER,
    NODE,
    ClaimBook,
    Node,
    NodeEdits,
    gpu,
    make_claim,
    node_options,
    ref,
)
from tests.waiting import wait_for


class _Quiet:
    """A HealthSource that never changes: a stream sends its list once, then waits."""

    def __init__(self) -> None:
        self.changes = ChangeFeed()

    def snapshot(self) -> Mapping[str, DeviceHealth]:
        return {}


class _Plugin:
    def __init__(self, root: Path, workers: int, book: Any) -> None:
        boot = root / "boot_id"
        boot.write_text("boot-1\n")
        self.source = _Quiet()
        opts, prepare = node_options(root, max_workers=workers)
        self.server = plugin_server(
            opts, prepare, lambda: Inventory(devices=tuple(gpu(i) for i in range(4))),
            NodeEdits(), book, metrics=Metrics(),
            health_servicer=HealthServicer(self.source, NODE),
        )
        self.server.start()
        self.kubelet = KubeletStandIn(opts.kubelet_dir / "plugins_registry").start()
        self.kubelet.wait_registered(DRIVER)

    def close(self) -> None:
        self.source.changes.close()
        self.kubelet.stop()
        self.server.stop(0)


@pytest.fixture
def small(short_root: Path) -> Iterator[tuple[_Plugin, ClaimBook]]:
    book = ClaimBook()
    p = _Plugin(short_root, 2, book)
    yield p, book
    p.close()


def _first_event(stream: Any) -> str:
    """"response" or the status code name of the error the stream ended with."""
    try:
        next(iter(stream))
    except grpc.RpcError as err:
        return str(err.code().name)
    return "response"


def test_open_health_streams_leave_prepare_its_threads(small: tuple[_Plugin, ClaimBook]) -> None:
    plugin, book = small
    # More streams than prepare threads (2) and stream slots together.
    streams = [plugin.kubelet.health_stream(DRIVER) for _ in range(MAX_STREAMS + 3)]
    events: list[str] = []
    readers = [threading.Thread(target=lambda s=s: events.append(_first_event(s)), daemon=True)
               for s in streams]
    for t in readers:
        t.start()
    try:
        wait_for(lambda: events.count("response") == MAX_STREAMS, what="streams open")
        claim = book.put(make_claim("c1", ["gpu-0"]))
        result = plugin.kubelet.prepare(DRIVER, [ref(claim)], timeout=20)
        assert result[claim["metadata"]["uid"]].ok
        assert plugin.kubelet.unprepare(DRIVER, [ref(claim)], timeout=20)[
            claim["metadata"]["uid"]].ok
        wait_for(lambda: len(events) == len(streams), what="every stream answered")
        assert sorted(events) == ["RESOURCE_EXHAUSTED"] * 3 + ["response"] * MAX_STREAMS
    finally:
        for s in streams:
            s.cancel()
    # A cancelled stream gives its slot back: the kubelet's reconnect is served.
    wait_for(lambda: plugin.server.streams.open == 0, what="slots given back")
    again = plugin.kubelet.health_stream(DRIVER)
    assert _first_event(again) == "response"
    again.cancel()


def test_claims_beyond_the_cap_get_an_error_each_and_are_never_fetched(node: Node) -> None:
    extra = 7
    refs = [ref(make_claim(f"c{i}", ["gpu-0"])) for i in range(MAX_CLAIMS_PER_CALL + extra)]
    out = node.kubelet.prepare(DRIVER, refs)
    assert len(out) == len(refs)
    assert node.book.gets == MAX_CLAIMS_PER_CALL  # the claims in the cap: not found, each
    for r in refs[:MAX_CLAIMS_PER_CALL]:
        assert "not found" in out[r.uid].error
    for r in refs[MAX_CLAIMS_PER_CALL:]:
        err = out[r.uid].error
        assert f"default/{r.name}" in err and "not prepared" in err
        assert f"over the limit of {MAX_CLAIMS_PER_CALL} per call" in err
    assert node.metrics.claim_errors.labels("prepare", "too_many_claims")._value.get() == extra

    gone = node.kubelet.unprepare(DRIVER, refs)
    assert [r.uid for r in refs if gone[r.uid].ok] == [r.uid for r in refs[:MAX_CLAIMS_PER_CALL]]
    assert "not unprepared" in gone[refs[-1].uid].error


class _Stalling:
    """Claims whose first GET blocks until the test lets it go; counts every GET."""

    def __init__(self) -> None:
        self.gets: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def get(self, claim: ClaimRef) -> Mapping[str, Any]:
        self.gets.append(claim.name)
        self.entered.set()
        self.release.wait(30)
        raise ClaimNotFoundError(str(claim), "not found in the API server (deleted?)")


def test_claims_not_started_by_the_deadline_get_no_work(short_root: Path) -> None:
    source = _Stalling()
    plugin = _Plugin(short_root, 2, source)
    try:
        refs = [ref(make_claim(f"c{i}", ["gpu-0"])) for i in range(5)]
        caller = threading.Thread(target=lambda: _expect_deadline(plugin, refs), daemon=True)
        caller.start()
        assert source.entered.wait(10)
        caller.join(30)  # the kubelet gives up while the first claim's GET hangs
        assert not caller.is_alive()
        # The server's deadline runs from when it received the call, and its cancel arrives
        # after the client's deadline: on a loaded machine both can trail the client by some
        # hundreds of ms. Let the GET go only well after that, or c1 is (rightly) still started.
        time.sleep(3)
        source.release.set()
        metrics = plugin.server.metrics
        wait_for(lambda: metrics.claim_errors.labels("prepare", "deadline")._value.get() == 4,
                 what="the remaining claims refused after the deadline")
        assert source.gets == ["c0"]
    finally:
        source.release.set()
        plugin.close()


def _expect_deadline(plugin: _Plugin, refs: list[Any]) -> None:
    with pytest.raises(PluginCallError) as err:
        plugin.kubelet.prepare(DRIVER, refs, timeout=1)
    assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_oversized_request_is_refused_whole_and_the_next_call_is_served(node: Node) -> None:
    channel = grpc.insecure_channel(f"unix://{node.server.paths.dra}")
    try:
        stub = pb_grpc.DRAPluginStub(channel)
        huge = pb.NodePrepareResourcesRequest(claims=[
            pb.Claim(namespace="default", name=f"c{i}", uid=f"{i:036d}") for i in range(50_000)])
        with pytest.raises(grpc.RpcError) as err:
            stub.NodePrepareResources(huge, timeout=30)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert node.book.gets == 0
    finally:
        channel.close()
    claim = node.book.put(make_claim("c1", ["gpu-1"]))
    assert node.prepare(claim)[claim["metadata"]["uid"]].ok
