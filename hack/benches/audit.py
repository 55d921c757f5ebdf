"""A kube-apiserver's audit log, read incrementally: which node sent what, and when (the
fleet bench counts each node's requests by its user, ``system:node:<node>``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

#: What counts as a write: these verbs, but not a dry run (the agent's list-attribute probe at
#: its start is a ``dryRun=All`` create: validated, never stored; a request, not a write).
WRITES = ("create", "update", "patch", "delete", "deletecollection")


class Audit:
    """The audit log read incrementally: each request once (by audit ID), with its user, verb,
    resource and the time the server received it."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset = path, 0
        self.events: dict[str, dict[str, Any]] = {}

    def read(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        last = chunk.rfind(b"\n") + 1
        self._offset += last
        for line in chunk[:last].decode().splitlines():
            event = json.loads(line)
            user = event.get("user", {}).get("username", "")
            if not user.startswith("system:node:"):
                continue
            event["_at"] = datetime.fromisoformat(
                event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            event["_node"] = user.removeprefix("system:node:")
            self.events[event["auditID"]] = event
        return list(self.events.values())

    def per_node(self, nodes: Sequence[str], since: float, until: float = float("inf"),
                 verbs: Sequence[str] | None = None) -> list[int]:
        counts = dict.fromkeys(nodes, 0)
        for e in self.read():
            if e["_node"] in counts and since <= e["_at"] < until and (
                    verbs is None or e["verb"] in verbs) and not (
                    verbs is WRITES and "dryRun=" in e.get("requestURI", "")):
                counts[e["_node"]] += 1
        return list(counts.values())

    def kinds(self, nodes: Sequence[str], since: float, until: float = float("inf")) -> str:
        """What the nodes' requests in the window were, per node on average: "get nodes 1,
        list resourceslices 1, ..." (a dry run counted apart)."""
        counts: dict[str, int] = {}
        for e in self.read():
            if e["_node"] in nodes and since <= e["_at"] < until:
                ref = e.get("objectRef") or {}
                what = ref.get("resource") or e.get("requestURI", "?").split("?")[0]
                kind = f"{e['verb']} {what}"
                if "dryRun=" in e.get("requestURI", ""):
                    kind += " (dry run)"
                counts[kind] = counts.get(kind, 0) + 1
        return ", ".join(f"{k} {v / len(nodes):.2g}" for k, v in sorted(counts.items()))

    def watches(self, nodes: Sequence[str], since: float) -> dict[str, float]:
        """node -> when it first started a ResourceSlice watch at or after ``since``."""
        first: dict[str, float] = {}
        for e in self.read():
            if e["_node"] in nodes and e["_at"] >= since and e["verb"] == "watch" and \
                    "resourceslices" in e.get("requestURI", ""):
                first[e["_node"]] = min(first.get(e["_node"], e["_at"]), e["_at"])
        return first

    def watching(self, nodes: Sequence[str], since: float) -> set[str]:
        """The nodes that started a ResourceSlice watch at or after ``since``."""
        return set(self.watches(nodes, since))
