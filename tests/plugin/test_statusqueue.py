"""agent.plugin.statusqueue: claim status reports run after the call that queued them, one per
claim at a time, inline when the queue is full or closed, never raising into the caller."""

from __future__ import annotations

import logging
import threading

import pytest

from agent.plugin.statusqueue import StatusReports


class Gate:
    """A report that waits for ``open`` and records the thread it ran on."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.threads: list[threading.Thread] = []

    def __call__(self) -> None:
        self.entered.set()
        assert self.open.wait(10)
        self.threads.append(threading.current_thread())


def test_a_report_runs_after_submit_returns_on_a_thread_of_its_own() -> None:
    reports, gate = StatusReports(), Gate()
    reports.submit("a", gate)  # returns although the report cannot finish yet
    assert gate.threads == [] and not reports.wait_idle(0)
    gate.open.set()
    assert reports.wait_idle(10)
    assert gate.threads and gate.threads[0] is not threading.current_thread()


def test_a_claim_with_a_report_pending_is_not_queued_again() -> None:
    reports, gate, again = StatusReports(), Gate(), Gate()
    reports.submit("a", gate)
    reports.submit("a", again)
    gate.open.set()
    again.open.set()
    assert reports.wait_idle(10)
    assert len(gate.threads) == 1 and again.threads == []
    reports.submit("a", again)  # done: the next report of the claim is queued
    assert reports.wait_idle(10) and len(again.threads) == 1


def test_a_full_queue_makes_the_caller_write_its_own() -> None:
    reports, first, second, third = StatusReports(limit=1), Gate(), Gate(), Gate()
    reports.submit("a", first)
    assert first.entered.wait(10)  # the thread holds "a": the queue is empty, "b" fits
    reports.submit("b", second)
    third.open.set()
    reports.submit("c", third)  # "b" waits: the queue is full
    first.open.set()
    second.open.set()
    assert reports.wait_idle(10)
    assert len(first.threads) == len(second.threads) == len(third.threads) == 1
    assert third.threads[0] is threading.current_thread()


def test_after_close_reports_run_inline() -> None:
    reports, gate = StatusReports(), Gate()
    gate.open.set()
    reports.submit("a", gate)
    assert reports.close(10)
    later = Gate()
    later.open.set()
    reports.submit("b", later)
    assert later.threads == [threading.current_thread()]


def test_a_report_that_raises_is_logged_and_the_queue_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise RuntimeError("bug")

    reports, gate = StatusReports(), Gate()
    gate.open.set()
    with caplog.at_level(logging.ERROR, logger="agent.plugin.statusqueue"):
        reports.submit("a", broken)
        reports.submit("b", gate)
        assert reports.wait_idle(10)
    assert len(gate.threads) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "claim status report failed unexpectedly"]


def test_the_thread_ends_when_idle_and_a_new_report_starts_another() -> None:
    reports, gate = StatusReports(idle_exit_s=0.01), Gate()
    gate.open.set()
    reports.submit("a", gate)
    assert reports.wait_idle(10)
    gate.threads[0].join(10)
    assert not gate.threads[0].is_alive()
    reports.submit("b", gate)
    assert reports.wait_idle(10) and len(gate.threads) == 2


def test_a_reserved_report_is_waited_for_before_it_is_started() -> None:
    reports, gate = StatusReports(), Gate()
    gate.open.set()
    start = reports.reserve("a", gate)
    assert start is not None
    assert reports.reserve("a", gate) is None  # pending already
    assert not reports.wait_idle(0)  # reserved: settle waits for it although not queued yet
    start()
    assert reports.wait_idle(10) and len(gate.threads) == 1
