"""Which resource.k8s.io version to talk to for ResourceClaims, learnt from the server.

Claims are read and their status written without API discovery: the first version in the
preference order is tried, and one the server answers as not served (404 not naming the object,
or 405) is dropped for the rest of the process. The last version is never dropped, so an
outage of the whole group cannot leave nothing to try.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

#: Preference order: the GA version first, then what 1.32 to 1.33 clusters serve.
CLAIM_API_VERSIONS = ("v1", "v1beta2", "v1beta1")


class ServedVersions:
    def __init__(self, versions: Sequence[str] = CLAIM_API_VERSIONS) -> None:
        self._versions = list(versions)
        self._lock = threading.Lock()

    def candidates(self, first: str | None = None) -> list[str]:
        """The versions to try now, in order; ``first`` (e.g. the version an object was read
        with, which the server therefore serves) leads when it is still a candidate."""
        with self._lock:
            versions = list(self._versions)
        if first in versions:
            versions.remove(first)
            versions.insert(0, first)
        return versions

    def not_served(self, version: str) -> bool:
        """Forget ``version`` unless it is the last one; True when another remains to try."""
        with self._lock:
            if len(self._versions) <= 1:
                return False
            if version in self._versions:
                self._versions.remove(version)
            return True
