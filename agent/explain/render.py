"""Text for people (a table per request) and json/yaml for tools (``status.allocation`` inside)."""

from __future__ import annotations

import json
from collections import Counter

from agent.explain.reasons import CONSTRAINT
from agent.explain.result import ExplainResult, PodExplainResult

#: In the table, at most this many rejected devices per reason are listed by name.
_NAMES_PER_REASON = 4


def to_table_pod(pod: PodExplainResult) -> str:
    """Each claim's table under one line for the pod: the claims fit only together."""
    head = (f"pod's {len(pod.claims)} claims on node {pod.node}: "
            + ("fit together" if pod.fits else "do not fit together"))
    if pod.error:
        head += f" ({pod.error})"
    return "\n\n".join([head, *(to_table(c) for c in pod.claims)])


def to_json(result: ExplainResult | PodExplainResult) -> str:
    return json.dumps(result.to_dict(), indent=2)


def to_yaml(result: ExplainResult | PodExplainResult) -> str:
    import yaml

    return str(yaml.safe_dump(result.to_dict(), sort_keys=False))


def to_table(result: ExplainResult) -> str:
    verdict = "FITS" if result.fits else "DOES NOT FIT"
    lines = [f"claim {result.claim} on node {result.node}: {verdict}"]
    for p in result.pools:
        note = f" ({p.message})" if p.message else ""
        lines.append(f"pool {p.driver}/{p.pool} generation {p.generation}: {p.devices} devices, "
                     f"{p.status}{note}")
    for r in result.requests:
        need = "all" if r.mode == "All" else str(r.needed)
        lines.append("")
        lines.append(f"request {r.request} (class {r.device_class}, needs {need}): {r.status}; "
                     f"{r.matching} match the selectors, {r.candidates} usable")
        if r.chosen:
            lines.append(f"  chosen: {', '.join(r.chosen)}")
        groups: dict[str, list[str]] = {}
        for v in r.devices:
            if v.reason is None:
                continue
            at = f"{v.device} ({v.where})" if v.where else v.device
            value = v.reason.detail.get("value") if v.reason.code == CONSTRAINT else None
            if value is not None and str(value) != v.where:
                at += f" {v.reason.detail.get('attribute', '').rpartition('/')[2]}={value}"
            groups.setdefault(v.reason.message, []).append(at)
        width = max((len(m) for m in groups), default=0)
        for message, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(names[:_NAMES_PER_REASON])
            more = f" +{len(names) - _NAMES_PER_REASON} more" if len(names) > _NAMES_PER_REASON \
                else ""
            lines.append(f"  {len(names):>4} x {message:<{min(width, 70)}}  {shown}{more}")
    if result.error:
        lines += ["", f"error: {result.error}"]
    if result.suggestion:
        lines += ["", f"to make it fit: {result.suggestion}"]
    if result.allocation:
        counts = Counter(r["request"] for r in result.allocation["devices"]["results"])
        lines += ["", "allocation: " + ", ".join(f"{k}={v}" for k, v in counts.items())]
    return "\n".join(lines)
