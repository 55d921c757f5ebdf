"""The controller's knobs: how fast it repairs, how long it watches, how it backs off."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Timing"]


@dataclass(frozen=True, slots=True)
class Timing:
    """Knobs; the defaults are the daemon's, tests shorten some."""

    event_delay_s: float = 0.1  # quiet time after a foreign change before repairing
    burst_max_s: float = 1.0  # a long burst of foreign changes is repaired after this
    watch_timeout_s: int = 300  # server-side end of each watch request
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    rejected_retry_max_s: float = 300.0  # the cap on retrying a pool the server refused (422)
    conflict_retries: int = 5  # re-read-and-plan-again rounds per sync before backing off
    stop_poll_s: float = 0.5  # how often a caller's stop_event is looked at
