"""Claims read from the API server: one GET per claim, never a cache (the kubelet has just
checked the claim, and a stale copy would prepare what was deallocated)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from agent.claim.model import ClaimFetchError, ClaimNotFoundError, ClaimRef
from agent.kube.apiversions import CLAIM_API_VERSIONS, ServedVersions, discovery_probe
from agent.kube.errors import KubeAPIError
from agent.kube.transport import KubeHTTP


class APIClaimSource:
    """GET of one ResourceClaim through a ``KubeHTTP``, as a dict.

    The first API version the server serves is remembered; a 404 that is not about the claim
    itself (the version is not served) moves on to the next version.
    """

    def __init__(
        self,
        http: KubeHTTP,
        versions: Sequence[str] = CLAIM_API_VERSIONS,
        timeout_s: float = 10.0,
    ) -> None:
        #: Public: the framework writes the claims' status through the same client.
        self.api_client = http
        self._http = http
        #: Well under the kubelet's 45 s call deadline, so the claim still gets its own answer.
        self.timeout_s = timeout_s
        self._versions = ServedVersions(versions, probe=discovery_probe(self._http))

    def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        for version in self._versions.candidates():
            # Checked as DNS names already (check_uid); quoted all the same, so that no
            # value can ever reach another path with the agent's credentials.
            path = (
                f"/apis/resource.k8s.io/{version}/namespaces/{quote(ref.namespace, safe='')}"
                f"/resourceclaims/{quote(ref.name, safe='')}"
            )
            try:
                resp = self._http.request("GET", path, timeout=self.timeout_s)
            except KubeAPIError as err:  # connection refused, timeouts
                raise ClaimFetchError(
                    str(ref), f"GET from the API server failed: {err.message}"
                ) from err
            if resp.status == 200:
                try:
                    return dict(json.loads(resp.body))
                except (ValueError, TypeError) as err:
                    raise ClaimFetchError(str(ref), f"the API server sent bad JSON: {err}") from err
            error = resp.error()
            if resp.status == 404 and error.about("resourceclaims", ref.name):
                raise ClaimNotFoundError(str(ref), "not found in the API server (deleted?)")
            if resp.status == 404 and self._versions.not_served(version):
                continue
            # The server's message says why (e.g. the Node authorizer's "no relationship found
            # between node ... and this object"), on one line.
            why = " ".join(error.message.split())[:300]
            raise ClaimFetchError(
                str(ref),
                f"GET from the API server failed: {resp.status} {resp.reason}"
                + (f": {why}" if why else ""),
            )
        raise ClaimFetchError(str(ref), "the API server serves no resource.k8s.io version")
