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

    def next(self) -> float:
        base = min(self.cap, self.initial * self.factor ** min(self.failures, 64))
        self.failures += 1
        return base * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0
