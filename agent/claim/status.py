"""Claim status for NICs: after a prepare, tell the cluster what the pod's network device is.

For each NIC or VF of a prepared claim the agent writes one ``status.devices`` entry
(``AllocatedDeviceStatus``): driver, pool, device (and shareID), a ``Ready=True`` condition and
``networkData`` (the interface name inside the pod, the addresses its netdev config gives it
(docs/netdev.md), the MAC address), as DRANET does, so users and controllers can find the
interface without exec'ing into the pod.

How it is written, and why:

* **Server-side apply on the ``/status`` subresource**, field manager ``<driver>``, forced.
  ``status.devices`` is a list-map keyed by driver, device, pool and shareID, so an apply owns
  exactly our entries: another driver's entries in the same claim are left alone, and entries
  we stop listing are removed by the server. ``metadata.uid`` rides along, so a claim deleted
  and re-created under the same name is refused rather than given our status.
* **The claim just fetched decides whether to write at all.** When it already shows our entries
  as we would write them (a repeated prepare, a restarted agent), nothing is sent; the
  ``Ready`` condition keeps its ``lastTransitionTime``, so a forced re-apply is a no-op too.
* **Never fatal.** The claim is prepared whatever happens here: a failure is logged (claim,
  device, cause) and counted (``dra_agent_claim_status_errors``). Credentials that may not
  write claim status (403: the node authorizer or RBAC without ``resourceclaims/status`` and,
  since 1.36, ``resourceclaims/driver`` ``associated-node:patch``) are reported in one log line;
  later refusals are only counted, until a write succeeds again. After a refusal for want of
  permission the writes rest for ``FORBIDDEN_HOLD_S`` (each skipped one counted as a
  refusal, the claim not marked reported, so its next prepare tries again): such a refusal
  is the identity's, not the claim's (the claim was just read with the same credentials), so
  the next claim's write would be refused too, and each refused write cost a request to the
  API server and about 1.4 ms of the agent's CPU (a node's own credentials, in
  ``hack.bench vs-upstream``, may never write claim status).
* **Versions**: the version the claim was read with first, then ``v1``, ``v1beta2``,
  ``v1beta1`` (the shape of ``status.devices`` is the same in all three); a 404 that is not
  about the claim (or a 405) moves on to the next version and the answer is remembered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from agent.common.metrics import Metrics
from agent.kube.apiversions import CLAIM_API_VERSIONS, ServedVersions, discovery_probe
from agent.kube.errors import KubeAPIError, parse_status
from agent.kube.transport import KubeHTTP

log = logging.getLogger(__name__)

#: resource.k8s.io versions tried in order; the parts a node plugin reads are the same in all.
READY_REASON = "Prepared"
_GROUP = "resource.k8s.io"
#: Seconds without status writes after one was refused for want of permission: a granted
#: permission is seen within this long; until then the refusals are counted, not sent.
FORBIDDEN_HOLD_S = 30.0


@dataclass(frozen=True, slots=True)
class NicStatus:
    """The facts one ``status.devices`` entry reports about a prepared NIC or VF."""

    pool: str
    device: str
    share_id: str | None = None
    interface_name: str | None = None  # inside the pod when moved there, else on the host
    hardware_address: str | None = None  # MAC
    #: The interface's addresses in the pod, as CIDRs (the claim's ``netdev.addresses``).
    ips: tuple[str, ...] = ()


class ClaimStatusError(Exception):
    """One status write failed; carries what an operator needs."""

    def __init__(self, claim: str, status: int, cause: str, *, forbidden: bool = False) -> None:
        super().__init__(f"claim {claim}: writing status.devices failed: {status} {cause}")
        self.claim = claim
        self.status = status
        self.cause = cause
        #: Refused for want of permission: a 403, or the 422 with a Forbidden cause on
        #: status.devices that 1.36+ answers without resourceclaims/driver permission.
        self.forbidden = forbidden or status == 403


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")), str(entry.get("pool", "")),
        str(entry.get("device", "")), str(entry.get("shareID") or ""),
    )  # fmt: skip


def _ready(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in entry.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond
    return None


def device_entries(
    claim: Mapping[str, Any],
    driver: str,
    node_name: str,
    nics: Sequence[NicStatus],
    now: Callable[[], str] = _rfc3339_now,
) -> list[dict[str, Any]]:
    """Our ``status.devices`` entries for ``claim``; a Ready=True condition already on the
    claim keeps its ``lastTransitionTime`` (the transition happened then, not now)."""
    current = {_key(e): e for e in _current_entries(claim)}
    generation = (claim.get("metadata") or {}).get("generation")
    out: list[dict[str, Any]] = []
    for nic in nics:
        entry: dict[str, Any] = {"driver": driver, "pool": nic.pool, "device": nic.device}
        if nic.share_id:
            entry["shareID"] = nic.share_id
        before = _ready(current.get(_key(entry), {}))
        since = before.get("lastTransitionTime") if before and before.get("status") == "True" \
            else None
        condition: dict[str, Any] = {
            "type": "Ready", "status": "True", "reason": READY_REASON,
            "message": f"prepared on node {node_name}",
            "lastTransitionTime": since or now(),
        }  # fmt: skip
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        entry["conditions"] = [condition]
        network: dict[str, Any] = {}
        if nic.interface_name:
            network["interfaceName"] = nic.interface_name
        if nic.ips:
            network["ips"] = list(nic.ips)
        if nic.hardware_address:
            network["hardwareAddress"] = nic.hardware_address
        if network:
            entry["networkData"] = network
        out.append(entry)
    return out


def _current_entries(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = claim.get("status")
    devices = status.get("devices") if isinstance(status, Mapping) else None
    if not isinstance(devices, list):
        return []
    return [e for e in devices if isinstance(e, Mapping)]


def up_to_date(claim: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> bool:
    """Does the claim already carry each entry (our fields, our Ready condition) as given?"""
    current = {_key(e): e for e in _current_entries(claim)}
    for entry in entries:
        have = current.get(_key(entry))
        if have is None:
            return False
        for field, value in entry.items():
            if field == "conditions":
                if _ready(have) != value[0]:
                    return False
            elif have.get(field) != value:
                return False
    return True


class ClaimStatusWriter:
    """Writes ``status.devices`` for NICs through a ``KubeHTTP``."""

    def __init__(
        self,
        http: KubeHTTP,
        driver: str,
        node_name: str,
        *,
        metrics: Metrics | None = None,
        versions: Sequence[str] = CLAIM_API_VERSIONS,
        field_manager: str | None = None,
        timeout_s: float = 5.0,
        now: Callable[[], str] = _rfc3339_now,
        forbidden_hold_s: float = FORBIDDEN_HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self.driver = driver
        self.node_name = node_name
        self.metrics = metrics or Metrics()
        self.field_manager = field_manager or driver
        #: Short: the write happens inside the kubelet's 45 s prepare call.
        self.timeout_s = timeout_s
        self._now = now
        self._versions = ServedVersions(versions, probe=discovery_probe(self._http))
        self._lock = threading.Lock()
        self._forbidden_logged = False
        self._forbidden_hold_s = forbidden_hold_s
        self._clock = clock
        #: ``clock()`` until which writes are not sent: the last one was refused for want
        #: of permission (0: none was).
        self._forbidden_until = 0.0

    def report(self, claim: Mapping[str, Any], nics: Sequence[NicStatus]) -> bool:
        """Apply our entries for ``claim``; True when written or already current. Never
        raises: a failure is logged and counted, and the next prepare of the claim retries."""
        if not nics:
            return True
        meta = claim.get("metadata") or {}
        label = f"{meta.get('namespace')}/{meta.get('name')} ({meta.get('uid')})"
        entries = device_entries(claim, self.driver, self.node_name, nics, self._now)
        if up_to_date(claim, entries):
            return True
        if self._clock() < self._forbidden_until:
            # Refused a moment ago for these credentials: this one would be too.
            self.metrics.claim_status_errors.inc()
            log.debug("claim status write skipped: refused for want of permission lately",
                      extra={"claim": label})
            return False
        try:
            self._apply(claim, entries, label)
        except ClaimStatusError as err:
            self.metrics.claim_status_errors.inc()
            if err.forbidden:
                self._forbidden_until = self._clock() + self._forbidden_hold_s
            self._log_failure(err, nics)
            return False
        except Exception as err:  # a bug here must never fail the prepare
            self.metrics.claim_status_errors.inc()
            log.exception("writing claim status failed unexpectedly", extra={"claim": label})
            self._log_failure(ClaimStatusError(label, 0, repr(err)), nics)
            return False
        with self._lock:
            was_forbidden, self._forbidden_logged = self._forbidden_logged, False
        if was_forbidden:
            log.info("claim status writes are allowed again", extra={"claim": label})
        log.info(
            "claim status written",
            extra={"claim": label, "devices": ",".join(n.device for n in nics)},
        )
        return True

    def _log_failure(self, err: ClaimStatusError, nics: Sequence[NicStatus]) -> None:
        devices = ",".join(n.device for n in nics)
        if err.forbidden:
            with self._lock:
                first, self._forbidden_logged = not self._forbidden_logged, True
            if not first:
                log.debug("claim status write forbidden", extra={"claim": err.claim})
                return
            log.warning(
                "claim status is not written: these credentials may not patch "
                "resourceclaims/status (grant resourceclaims/status patch and, since 1.36, "
                "resourceclaims/driver associated-node:patch); prepares are unaffected, "
                "further refusals are only counted",
                extra={"claim": err.claim, "devices": devices, "error": err.cause},
            )
            return
        log.warning(
            "claim status write failed; the claim is prepared anyway",
            extra={"claim": err.claim, "devices": devices, "status": err.status,
                   "error": err.cause},
        )

    def _order(self, claim: Mapping[str, Any]) -> list[str]:
        """The version the claim was read with first: the server serves it."""
        api_version = str(claim.get("apiVersion", ""))
        if not api_version.startswith(f"{_GROUP}/"):
            return self._versions.candidates()
        return self._versions.candidates(api_version.removeprefix(f"{_GROUP}/"))

    def _apply(
        self, claim: Mapping[str, Any], entries: Sequence[Mapping[str, Any]], label: str
    ) -> None:
        meta = claim.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        versions = self._order(claim)
        for version in versions:
            body = {
                "apiVersion": f"{_GROUP}/{version}",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns, "uid": meta.get("uid")},
                "status": {"devices": list(entries)},
            }
            path = (f"/apis/{_GROUP}/{version}/namespaces/{quote(ns, safe='')}"
                    f"/resourceclaims/{quote(name, safe='')}/status")
            status, reason, data = self._patch(path, body, label)
            if 200 <= status < 300:
                return
            # A version that is not served: 404 not naming the claim (some servers answer 405).
            unserved = status == 405 or (status == 404 and not self._about_claim(data, name))
            if unserved and len(versions) > 1 and self._versions.not_served(version):
                continue
            raise ClaimStatusError(label, status, self._message(data) or reason,
                                   forbidden=self._forbidden_field(status, data))
        raise ClaimStatusError(label, 404, "the API server serves no resource.k8s.io version")

    def _patch(self, path: str, body: Mapping[str, Any], label: str) -> tuple[int, str, bytes]:
        query = [("fieldManager", self.field_manager), ("force", "true")]
        try:
            # JSON is YAML: the apply body is our JSON, sent as is.
            resp = self._http.request(
                "PATCH", path, query=query, body=json.dumps(body).encode(),
                content_type="application/apply-patch+yaml", timeout=self.timeout_s,
            )  # fmt: skip
        except KubeAPIError as err:  # connection refused, timeouts: no HTTP answer
            raise ClaimStatusError(label, 0, f"{err.reason}: {err.message}") from err
        return resp.status, resp.reason, resp.body

    @staticmethod
    def _message(data: bytes) -> str:
        try:
            status = json.loads(data or b"{}")
        except ValueError:
            return ""
        return str(status.get("message", "")) if isinstance(status, dict) else ""

    @staticmethod
    def _forbidden_field(status: int, data: bytes) -> bool:
        """Since 1.36 a status.devices write without resourceclaims/driver permission is not
        a 403 but a 422 Invalid whose cause is ``FieldValueForbidden`` on status.devices (the
        check runs in the strategy's validation, after RBAC let the request in)."""
        if status != 422:
            return False
        causes = parse_status("PATCH", "", status, data).causes
        return any(c.reason == "FieldValueForbidden" and c.field.startswith("status.devices")
                   for c in causes)

    @staticmethod
    def _about_claim(data: bytes, name: str) -> bool:
        """A 404 naming the claim means "no such claim"; any other 404 means "no such API"."""
        return parse_status("PATCH", "", 404, data).about("resourceclaims", name)
