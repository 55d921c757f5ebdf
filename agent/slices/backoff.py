"""Exponential back-off with jitter, capped, as one small object per retrying thing."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays ``initial * factor**n``, at most ``cap``, each scaled by a random 0.5-1.0.

    The jitter keeps a fleet of agents that lost the API server at the same moment from
    coming back in lockstep.
    """

    initial: float = 0.2
    cap: float = 30.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next(self, retry_after: float | None = None) -> float:
        """The next delay; at least ``retry_after`` (the server's ``Retry-After``) when given,
        spread over up to half as much again, so that agents told the same second by one busy
        server do not all come back at that second. The cap bounds our own growth, not the
        server's word (``agent.kube.errors.RETRY_AFTER_MAX_S`` bounds that)."""
        base = min(self.cap, self.initial * self.factor ** min(self.failures, 64))
        self.failures += 1
        delay = base * self.rng.uniform(0.5, 1.0)
        if retry_after:
            delay = max(delay, retry_after * self.rng.uniform(1.0, 1.5))
        return delay

    def reset(self) -> None:
        self.failures = 0
