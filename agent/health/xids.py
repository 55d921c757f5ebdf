"""NVIDIA Xid numbers and what they mean, for readable health messages.

The kernel driver logs an Xid for each GPU error it detects; NVML hands the same number to
event-set listeners. The table keeps the Xids a data-centre operator meets; any other number
still becomes a message, just without a meaning. Wording is ours, summarised from NVIDIA's
Xid catalogue and memory-error documentation.
"""

from __future__ import annotations

#: Xids that are usually caused by the application, not the hardware: NVIDIA's own device
#: plugin and DRA driver skip them, and so do we unless the operator changes the list.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed",
}


def describe_xid(xid: int) -> str:
    """``"Xid 79: GPU has fallen off the bus"``; unknown numbers say where to look."""
    meaning = XID_MEANINGS.get(xid)
    if meaning is None:
        return f"Xid {xid}: critical GPU error (see the NVIDIA Xid catalogue)"
    return f"Xid {xid}: {meaning}"
