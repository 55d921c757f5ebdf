"""What the real kubelet's DRA manager showed in each pod scenario of
tests/realk8s/test_kubelet_dra.py, kept in one place so that tests/e2e/test_pod_scenarios.py
(PodClaims driving the real agent) expects the same of the stand-in.

Only what both suites can assert alike lives here: the kubelet's own refusals (made before
any plugin call, so the agent never sees them) and how often a container lists a CDI ID after
a kubelet restart. Outcomes that follow from the agent's answer (the CDI IDs, the env the
spec injects, records and spec files) are the same assertions in both suites by construction.
"""

from __future__ import annotations

from typing import Final

#: scenario -> a fragment of the pod's error, compared lower-cased (1.35 writes "pod" where
#: 1.37 writes "Pod").
REFUSALS: Final[dict[str, str]] = {
    # A claim reserved for another pod.
    "not reserved for the pod": "is not allowed to use resourceclaim",
    # A template claim before the resourceclaim controller has named it in the pod's status.
    "template claim not made yet": "resourceclaim not created yet",
    # A template claim named in the pod's status but controlled by another pod.
    "template claim of another pod": "(pod is not owner)",
}

#: Times each CDI ID appears in a container's list after a kubelet restart re-sent prepare:
#: 1.35's claim cache appends the re-sent devices to those restored from its checkpoint.
#: The stand-in has no checkpoint (README.md) and plays 1.37.
CDI_REPEATS_AFTER_RESTART: Final[dict[str, int]] = {"1.35": 2, "1.37": 1, "stand-in": 1}


def refused(scenario: str, error: str) -> bool:
    """Whether ``error`` is the kubelet's refusal in ``scenario``."""
    return REFUSALS[scenario] in error.lower()
