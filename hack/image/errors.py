"""The one error the image tools raise: a message for one line and the exit status."""

from __future__ import annotations

# Exit statuses: bad input or a missing tool or privilege (fix the invocation) against a step
# that ran and failed (read its log).
USAGE = 2
FAILED = 1


class BuildError(Exception):
    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status
