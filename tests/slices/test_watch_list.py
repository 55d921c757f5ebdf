"""Listing by watch-list: the state as a watch's first events, one request where a list and a
watch were two; list and watch apart where the server has no watch-list."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent.slices import Owner, start
from agent.slices.api import KubeSliceClient, WatchEvent, WatchStream, is_initial_end
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.conftest import FAST, Harness, listings, our_slices, writes
from tests.slices.helpers import DRIVER, NODE, node, pool_of, resources
from tests.waiting import wait_for


def slice_reads(srv: FakeAPIServer) -> list[tuple[str, bool]]:
    """(verb, a watch-list) of each list or watch of ResourceSlices."""
    return [(r.verb, r.query.get("sendInitialEvents") == "true") for r in srv.requests
            if r.verb in ("list", "watch") and "resourceslices" in r.path]


def test_a_start_lists_and_watches_in_one_request(srv: FakeAPIServer,
                                                  harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(4)))
    assert c.synced(10)
    assert len(our_slices(srv)) == 1
    assert slice_reads(srv) == [("watch", True)]
    # A second controller on the same slices adopts them from its watch-list: no write.
    c.stop()
    srv.clear_requests()
    c2 = harness.start(srv, resources(node1=pool_of(4)))
    assert c2.synced(10)
    assert writes(srv) == [] and slice_reads(srv) == [("watch", True)]


def test_without_watch_list_it_lists_and_watches_apart(harness: Harness,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="agent.slices")
    with FakeAPIServer(bookmark_interval=0.5, feature_gates={"WatchList": False}) as server:
        server.put_object(node())
        c = harness.start(server, resources(node1=pool_of(4)), resync_period_s=0.3)
        assert c.synced(10)
        assert len(our_slices(server)) == 1
        wait_for(lambda: listings(server) >= 3, what="two resyncs")
        reads = slice_reads(server)
        # One refused watch-list, then lists and watches only: it is not asked again.
        assert reads[0] == ("watch", True) and ("watch", True) not in reads[1:]
        assert ("list", False) in reads and ("watch", False) in reads
        assert [w for w in writes(server) if w[0] != "create"] == []
        said = [r for r in caplog.records if "has no watch-list" in r.getMessage()]
        assert len(said) == 1
        c.stop()


class _CutBeforeTheEnd:
    """A watch-list stream that ends where its initial-events-end bookmark would come (a
    proxy cutting it, a server that never sends it)."""

    def __init__(self, inner: WatchStream) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[WatchEvent]:
        for event in self._inner:
            if is_initial_end(event):
                return
            yield event

    def close(self) -> None:
        self._inner.close()


class _NoEnd(KubeSliceClient):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cut = 0

    def watch_list(self, version: str, field_selector: str, timeout_s: int) -> WatchStream:
        self.cut += 1
        return _CutBeforeTheEnd(super().watch_list(version, field_selector, timeout_s))


def test_watch_lists_that_never_end_their_initial_events_give_way_to_a_list(
        srv: FakeAPIServer) -> None:
    client = _NoEnd(srv.kube())
    c = start(client, DRIVER, Owner(name=NODE), resources(node1=pool_of(2)), timing=FAST,
              resync_period_s=3600)
    try:
        assert c.synced(10)  # listed in the end, and published from a complete state
        assert client.cut == 3
        assert len(our_slices(srv)) == 1
        assert slice_reads(srv).count(("list", False)) == 1
    finally:
        c.stop()
