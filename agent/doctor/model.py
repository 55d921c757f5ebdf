"""The result of one check, and what every check reads: the host root and the agent's options."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report. ``fix`` is empty exactly when there is nothing to do."""

    name: str
    status: Status
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": str(self.status), "found": self.found,
                "fix": self.fix}


def ok(name: str, found: str) -> Check:
    return Check(name, Status.OK, found)


def warn(name: str, found: str, fix: str) -> Check:
    return Check(name, Status.WARN, found, fix)


def fail(name: str, found: str, fix: str) -> Check:
    return Check(name, Status.FAIL, found, fix)


def skipped(name: str, why: str) -> Check:
    return Check(name, Status.SKIPPED, why)
