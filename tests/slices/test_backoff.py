"""Back-off delays: exponential with jitter, and a server's Retry-After honoured, spread."""

from __future__ import annotations

import random

from agent.kube.errors import RETRY_AFTER_MAX_S, parse_status, retry_after_s
from agent.slices.backoff import Backoff


def test_retry_after_is_a_floor_spread_over_half_as_much_again() -> None:
    backoff = Backoff(initial=0.05, cap=0.5, rng=random.Random(7))
    delays = [backoff.next(retry_after=2.0) for _ in range(50)]
    assert all(2.0 <= d <= 3.0 for d in delays), delays
    assert max(delays) - min(delays) > 0.3  # not in lockstep
    plain = Backoff(initial=0.05, cap=0.5, rng=random.Random(7))
    assert all(d <= 0.5 for d in (plain.next() for _ in range(20)))  # the cap, without one


def test_retry_after_read_from_the_answer_and_bad_values_ignored() -> None:
    err = parse_status("POST", "/x", 429, b'{"kind":"Status","reason":"TooManyRequests"}',
                       {"retry-after": "3"})
    assert err.retry_after == 3.0 and err.reason == "TooManyRequests"
    assert parse_status("POST", "/x", 429, b"", {}).retry_after is None
    # An HTTP date, a fraction, nothing, an Arabic-Indic one (isdigit, not ASCII).
    for bad in ("-1", "1.5", "Wed, 21 Oct 2026 07:28:00 GMT", "", "\u0661"):
        assert retry_after_s({"retry-after": bad}) is None, bad
    assert retry_after_s({"retry-after": "99999999"}) == RETRY_AFTER_MAX_S
