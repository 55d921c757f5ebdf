"""Which resource.k8s.io version to talk to for ResourceClaims, learnt from the server.

Claims are read and their status written with the first version in the preference order. A
404 that does not name the object, or a 405, suggests the version is not served; but a proxy
or an API server in the middle of an upgrade answers such 404s too, so a version is dropped
only when API discovery (``GET /apis/resource.k8s.io``) confirms the server does not list it,
and only for ``retry_after_s``: after that it is tried again (a cluster upgrade brings v1). The
last version is never dropped, so an outage of the whole group cannot leave nothing to try.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Preference order: the GA version first, then what 1.32 to 1.33 clusters serve.
CLAIM_API_VERSIONS = ("v1", "v1beta2", "v1beta1")
GROUP = "resource.k8s.io"
#: How long a version discovery said is not served stays out of the candidates.
RETRY_AFTER_S = 300.0

#: ``probe(version)``: True when discovery lists it, False when it does not, None when
#: discovery itself could not be asked (then nothing is dropped: there is no proof).
Probe = Callable[[str], "bool | None"]

log = logging.getLogger(__name__)


def discovery_probe(http: Any, timeout_s: float = 5.0) -> Probe:
    """A ``Probe`` that asks the API server's discovery through a ``KubeHTTP``."""

    def probe(version: str) -> bool | None:
        try:
            resp = http.request("GET", f"/apis/{GROUP}", timeout=timeout_s)
        except Exception:  # no answer at all: no proof either way
            return None
        if resp.status == 404:
            return False  # the whole group is not served
        if resp.status != 200:
            return None
        try:
            doc = json.loads(resp.body)
            served = {str(v.get("version")) for v in doc.get("versions") or []}
        except (ValueError, AttributeError, TypeError):
            return None
        return version in served

    return probe


class ServedVersions:
    def __init__(
        self,
        versions: Sequence[str] = CLAIM_API_VERSIONS,
        *,
        probe: Probe | None = None,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._versions = list(versions)
        self._probe = probe
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._dropped: dict[str, float] = {}  # version -> when discovery said "not served"
        self._lock = threading.Lock()

    def candidates(self, first: str | None = None) -> list[str]:
        """The versions to try now, in order; ``first`` (e.g. the version an object was read
        with, which the server therefore serves) leads when it is still a candidate."""
        now = self._clock()
        with self._lock:
            for version, since in list(self._dropped.items()):
                if now - since >= self._retry_after_s:
                    del self._dropped[version]  # time to look again
            versions = [v for v in self._versions if v not in self._dropped]
        if first in versions:
            versions.remove(first)
            versions.insert(0, first)
        return versions

    def not_served(self, version: str) -> bool:
        """The server answered ``version`` as if it were not served. Drop it when that is
        proven (or no probe is configured) and another version remains; True when the
        caller should go on with the next candidate."""
        with self._lock:
            remaining = [v for v in self._versions if v not in self._dropped]
            if version not in remaining:
                return bool(remaining)  # another call dropped it meanwhile
            if len(remaining) <= 1:
                return False
        if self._probe is not None:
            served = self._probe(version)
            if served is not False:
                # Listed by discovery, or discovery did not answer: the 404 came from
                # somewhere else (a proxy, an upgrade in progress). Keep the version.
                log.info("resource.k8s.io version kept: discovery does not confirm it is "
                         "unserved", extra={"version": version, "discovery": served})
                return False
        with self._lock:
            self._dropped[version] = self._clock()
        log.info("resource.k8s.io version not served; trying the next",
                 extra={"version": version, "retry_in_s": self._retry_after_s})
        return True
