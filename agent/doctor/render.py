"""The report as a table (one row per check, the fix under a row that needs one) or JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from agent.doctor.model import Check, Status

_MARK = {Status.OK: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIPPED: "skip"}


def to_table(checks: Sequence[Check]) -> str:
    width = max((len(c.name) for c in checks), default=5)
    lines = [f"{'CHECK':<{width}}  STATUS  FOUND"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {_MARK[c.status]:<6}  {c.found}")
        if c.fix:
            lines.append(f"{'':<{width}}  {'':<6}  fix: {c.fix}")
    lines.append(summary(checks))
    return "\n".join(lines)


def summary(checks: Sequence[Check]) -> str:
    counts = Counter(c.status for c in checks)
    return ", ".join(f"{counts[s]} {s}" for s in Status)


def to_json(checks: Sequence[Check]) -> str:
    counts = Counter(str(c.status) for c in checks)
    doc = {"checks": [c.to_json() for c in checks],
           "summary": {str(s): counts[str(s)] for s in Status},
           "ok": not counts[str(Status.FAIL)]}
    return json.dumps(doc, indent=2)
