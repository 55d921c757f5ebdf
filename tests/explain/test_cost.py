"""What explain does to the process for speed: the cyclic collector is paused for one call
and left as the caller had it, also when the call fails."""

from __future__ import annotations

import gc
import time

import pytest

from agent.explain import InputError, explain
from tests.explain.builders import CLASSES, NODE, claim, dgx_slice, exactly


@pytest.fixture
def collector_restored():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_inside_and_left_as_the_caller_had_it(collector_restored,
                                                                      enabled):
    (gc.enable if enabled else gc.disable)()
    inside: list[bool] = []

    def clock() -> float:  # the search's clock: read while the call runs
        inside.append(gc.isenabled())
        return time.monotonic()

    assert explain(claim(exactly("gpu", count=2)), CLASSES, [dgx_slice()], NODE,
                   clock=clock).fits
    assert inside and not any(inside)
    assert gc.isenabled() is enabled


def test_the_collector_comes_back_after_bad_input(collector_restored):
    gc.enable()
    with pytest.raises(InputError):
        explain(claim(exactly("gpu", "no-such-class")), CLASSES, [dgx_slice()], NODE)
    assert gc.isenabled()
