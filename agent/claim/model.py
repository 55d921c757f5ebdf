"""ResourceClaim dicts (as the API server returns them) -> the few facts a node plugin needs.

The claim is read as a plain dict (any of resource.k8s.io v1, v1beta2, v1beta1: the parts read
here, ``metadata`` and ``status.allocation``, have the same shape in all three). Each problem is
a ``ClaimError`` naming the claim and the JSON path, so the kubelet's event tells the operator
what to fix.

Every string read here must be valid Unicode. ``json.loads`` turns a ``"\\ud800"`` escape into
a lone UTF-16 surrogate, which no UTF-8 encoder takes: it would fail the checkpoint's write
(and the kubelet's gRPC answer) long after parsing, far from the claim at fault. So it is
refused here, once, naming the field (``unwritable_path``), as is nesting too deep for the
checkpoint's JSON encoder.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.common.k8snames import dns_label_problem, dns_subdomain_problem
from agent.common.quantity import is_quantity, parse_quantity


class ClaimError(Exception):
    """A per-claim failure; ``reason`` is a short label for metrics."""

    reason = "invalid"

    def __init__(self, claim: str, message: str) -> None:
        super().__init__(f"claim {claim}: {message}")
        self.claim = claim
        self.message = message


class ClaimNotFoundError(ClaimError):
    reason = "not_found"


class ClaimReplacedError(ClaimError):
    reason = "replaced"


class ClaimNotAllocatedError(ClaimError):
    reason = "not_allocated"


class ClaimFetchError(ClaimError):
    reason = "fetch"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for one claim."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry."""

    request: str  # "<request>" or "<request>/<subrequest>"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    #: ``consumedCapacity`` of a share (name -> quantity), sorted by name; empty otherwise.
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def consumed_capacity(self) -> dict[str, str]:
        return dict(self.consumed)

    @property
    def base_request(self) -> str:
        """The request name containers reference: everything before the first ``/``."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One ``status.allocation.devices.config[]`` entry with opaque parameters."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]  # empty: applies to every request
    driver: str
    parameters: Any

    def applies_to(self, result: AllocatedDevice) -> bool:
        if not self.requests:
            return True
        return result.request in self.requests or result.base_request in self.requests


#: Set by the resource claim controller on a claim it made from a template: the pod's entry
#: (``pod.spec.resourceClaims[].name``) the claim was generated for.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True, slots=True)
class Claim:
    ref: ClaimRef
    allocated: bool
    results: tuple[AllocatedDevice, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()
    #: The ``POD_CLAIM_NAME_ANNOTATION`` value; None when the claim has none.
    pod_claim_name: str | None = None

    def results_for(self, driver: str) -> tuple[AllocatedDevice, ...]:
        return tuple(r for r in self.results if r.driver == driver)

    def configs_for(self, driver: str, result: AllocatedDevice) -> list[OpaqueConfig]:
        """Configs of ``driver`` that apply to ``result``, lowest precedence first.

        Class configs come before claim configs (the claim author overrides the admin's
        defaults); within a source, later entries win, so callers merge in list order.
        """
        mine = [c for c in self.configs if c.driver == driver and c.applies_to(result)]
        return [c for c in mine if c.source == "FromClass"] + [
            c for c in mine if c.source != "FromClass"
        ]


#: Longest claim UID accepted. The API server's UIDs are 36-character UUIDs; the bound keeps
#: ``k8s.<driver>-claim_<uid>.json`` well under the 255-byte file name limit.
UID_MAX_LEN = 128
# A claim UID becomes part of a CDI device name (``<uid>-<device>``) and of the spec's file
# name, so it may hold only what both can: letters, digits and ``_ . : -``, starting and ending
# with a letter or digit. No ``/``, NUL, newline or non-ASCII can get as far as a path.
_UID_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?", re.ASCII)


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot be a claim UID on this node, or None when it can."""
    if not uid:
        return "the claim UID is empty"
    if len(uid) > UID_MAX_LEN:
        return f"the claim UID is {len(uid)} characters long (at most {UID_MAX_LEN})"
    if not _UID_RE.fullmatch(uid):
        return (
            f"the claim UID {uid!r} is not one the API server generates: only letters, digits "
            "and '_.:-', starting and ending with a letter or digit, fit in a CDI device name"
        )
    return None


def name_problem(namespace: str, name: str) -> str | None:
    """Why ``namespace``/``name`` cannot be a ResourceClaim's, or None when they can.

    The API server only ever names claims so (a namespace is a DNS label, a claim a DNS
    subdomain). Anything else from the kubelet socket would end up in a request path sent
    with the agent's credentials (``..``, ``/``, ``?``), so it is refused before any request.
    """
    if (why := dns_label_problem(namespace)) is not None:
        return f"the claim namespace {namespace!r} is not a DNS label: {why}"
    if (why := dns_subdomain_problem(name)) is not None:
        return f"the claim name {name!r} is not a DNS subdomain: {why}"
    return None


def check_uid(ref: ClaimRef) -> None:
    """Refuse a claim UID that no CDI name or spec file can hold, and a namespace or name no
    claim can have, before any other work."""
    problem = uid_problem(ref.uid) or name_problem(ref.namespace, ref.name)
    if problem is not None:
        raise ClaimError(str(ref), problem)


def parse_claim(obj: Any, expected: ClaimRef | None = None) -> Claim:
    """Decode a ResourceClaim dict; with ``expected``, check that it is the claim asked for.

    The dict is untrusted (the API server's answer, a test's): a value of the wrong type
    anywhere is a ``ClaimError`` naming its JSON path, never an AttributeError.
    """
    label = str(expected or "?")
    if not isinstance(obj, Mapping):
        raise ClaimError(label, f"the API server sent a {type(obj).__name__}, not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError(label, "object has no metadata")
    ref = ClaimRef(
        namespace=_get_str(meta, "namespace", label, "metadata"),
        name=_get_str(meta, "name", label, "metadata"),
        uid=_get_str(meta, "uid", label, "metadata"),
    )
    # Before any message quotes them: the label itself must be safe to log and send.
    _check_encodable(str(expected) if expected else ascii(str(ref)),
                     {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}, "metadata")
    if expected is not None and ref.uid != expected.uid:
        raise ClaimReplacedError(
            str(expected),
            f"the API server has a different claim under this name (uid {_shown(ref.uid)}); "
            "the claim was deleted and re-created, so the pod must be re-created too",
        )
    label = str(expected or ref)
    annotations = _get_mapping(meta, "annotations", label, "metadata") or {}
    pod_claim_name = annotations.get(POD_CLAIM_NAME_ANNOTATION)
    if pod_claim_name is not None and not (isinstance(pod_claim_name, str)
                                           and encodes(pod_claim_name)):
        raise ClaimError(label, f"metadata.annotations[{POD_CLAIM_NAME_ANNOTATION}] is not a "
                                "string")
    status = _get_mapping(obj, "status", label, "") or {}
    allocation = _get_mapping(status, "allocation", label, "status")
    if not allocation:
        return Claim(ref=ref, allocated=False, pod_claim_name=pod_claim_name)
    devices = _get_mapping(allocation, "devices", label, "status.allocation") or {}
    results, configs = parse_devices(devices, label)
    return Claim(ref=ref, allocated=True, results=results, configs=configs,
                 pod_claim_name=pod_claim_name)


def parse_devices(
    devices: Mapping[str, Any], label: str
) -> tuple[tuple[AllocatedDevice, ...], tuple[OpaqueConfig, ...]]:
    """``status.allocation.devices``: its results and its opaque configs."""
    _check_encodable(label, devices, "status.allocation.devices")
    results = tuple(
        _parse_result(r, label, i) for i, r in enumerate(_get_list(devices, "results", label))
    )
    configs = tuple(
        _parse_config(c, label, i) for i, c in enumerate(_get_list(devices, "config", label))
    )
    return results, configs


def allocation_json(claim: Claim, driver: str) -> dict[str, Any]:
    """``driver``'s part of ``status.allocation.devices`` in API form; ``parse_devices`` reads
    it back. Kept with a prepared claim so a repeated prepare needs no API server."""
    results: list[dict[str, Any]] = []
    for r in claim.results_for(driver):
        item: dict[str, Any] = {
            "request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device,
        }
        if r.admin_access:
            item["adminAccess"] = True
        if r.share_id:
            item["shareID"] = r.share_id
        if r.consumed:
            item["consumedCapacity"] = r.consumed_capacity
        results.append(item)
    configs = [
        {"source": c.source, "requests": list(c.requests),
         "opaque": {"driver": c.driver, "parameters": c.parameters}}
        for c in claim.configs if c.driver == driver
    ]
    return {"results": results, "config": configs}


#: How deep a claim's JSON may nest. The checkpoint keeps this driver's opaque parameters, and
#: Python's json encoder recurses: near its recursion limit (~1,000) the durable write would
#: fail long after parsing. The API server lets 10 KiB of parameters nest thousands deep; our
#: own DeviceConfig needs 3 levels, so 64 refuses nothing real.
MAX_DEPTH = 64


def unwritable_path(value: Any, path: str) -> tuple[str, str] | None:
    """The JSON path of the first part of ``value`` that cannot be written to the checkpoint
    or a CDI spec, and why: a string (key or value) that is not valid Unicode (it cannot be
    encoded as UTF-8), or nesting deeper than ``MAX_DEPTH``. None when everything can.

    Iterative, so a deeply nested opaque parameter cannot exhaust the stack; the path shows a
    key that is itself the problem escaped (ASCII), so the error line is safe to log and send.
    """
    stack: list[tuple[str, Any, int]] = [(path, value, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, str):
            if not encodes(item):
                return where, _NOT_UNICODE
            continue
        if isinstance(item, Mapping | list | tuple) and depth >= MAX_DEPTH:
            # The path of a 2,000-deep list is thousands of "[0]": its start says enough.
            shown = where if len(where) <= 120 else where[:117] + "..."
            return shown, f"nests deeper than {MAX_DEPTH} levels"
        if isinstance(item, Mapping):
            for key, child in item.items():
                shown = key if isinstance(key, str) and key.isprintable() else ascii(key)
                if isinstance(key, str) and not encodes(key):
                    return f"{where}.{shown}", _NOT_UNICODE
                stack.append((f"{where}.{shown}", child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child, depth + 1) for i, child in enumerate(item))
    return None


_NOT_UNICODE = "holds a string that is not valid Unicode (a lone UTF-16 surrogate such as \\ud800)"


def _shown(text: str) -> str:
    """``text`` as is when it is printable, else escaped: one line, whatever the server sent."""
    return text if text.isprintable() else ascii(text)


def encodes(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_encodable(label: str, value: Any, path: str) -> None:
    found = unwritable_path(value, path)
    if found is not None:
        where, why = found
        raise ClaimError(
            label, f"{where} {why}; it cannot be written to the checkpoint or a CDI spec")


def _parse_result(item: Any, label: str, index: int) -> AllocatedDevice:
    path = f"status.allocation.devices.results[{index}]"
    if not isinstance(item, Mapping):
        raise ClaimError(label, f"{path} is not an object")
    fields = {}
    for key in ("request", "driver", "pool", "device"):
        value = item.get(key)
        if not isinstance(value, str) or not value:
            raise ClaimError(label, f"{path}.{key} is missing or not a string")
        fields[key] = value
    share = item.get("shareID")
    if share is not None and not isinstance(share, str):
        raise ClaimError(label, f"{path}.shareID is not a string")
    return AllocatedDevice(
        request=fields["request"],
        driver=fields["driver"],
        pool=fields["pool"],
        device=fields["device"],
        admin_access=item.get("adminAccess") is True,
        share_id=share or None,
        consumed=_parse_consumed(item.get("consumedCapacity"), label, path),
    )


def _parse_consumed(value: Any, label: str, path: str) -> tuple[tuple[str, str], ...]:
    """``consumedCapacity``: capacity name -> quantity (the API server sends strings)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ClaimError(label, f"{path}.consumedCapacity is not an object")
    out: list[tuple[str, str]] = []
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise ClaimError(label, f"{path}.consumedCapacity has a name that is not a string")
        text = str(amount) if isinstance(amount, int) and not isinstance(amount, bool) \
            else amount
        if not isinstance(text, str) or not is_quantity(text) or parse_quantity(text) < 0:
            raise ClaimError(label, f"{path}.consumedCapacity[{_shown(name)[:60]}] is not "
                                    f"a quantity such as 2 or 10Gi")
        out.append((name, text))
    return tuple(sorted(out))


def _parse_config(item: Any, label: str, index: int) -> OpaqueConfig:
    path = f"status.allocation.devices.config[{index}]"
    if not isinstance(item, Mapping):
        raise ClaimError(label, f"{path} is not an object")
    opaque = item.get("opaque")
    if not isinstance(opaque, Mapping):
        raise ClaimError(label, f"{path} has no opaque configuration (the only kind supported)")
    driver = opaque.get("driver")
    if not isinstance(driver, str):
        raise ClaimError(label, f"{path}.opaque.driver is missing")
    requests = item.get("requests") or []
    if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
        raise ClaimError(label, f"{path}.requests must be a list of request names")
    source = item.get("source", "FromClaim")
    if not isinstance(source, str):
        raise ClaimError(label, f"{path}.source is not a string")
    return OpaqueConfig(
        source=source,
        requests=tuple(requests),
        driver=driver,
        parameters=opaque.get("parameters"),
    )


def _get_mapping(obj: Mapping[str, Any], key: str, label: str, where: str) -> Any:
    value = obj.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise ClaimError(label, f"{where + '.' if where else ''}{key} is not an object")
    return value


def _get_str(obj: Mapping[str, Any], key: str, label: str, where: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise ClaimError(label, f"{where}.{key} is not a string")
    return value


def _get_list(obj: Mapping[str, Any], key: str, label: str) -> list[Any]:
    value = obj.get(key) or []
    if not isinstance(value, list):
        raise ClaimError(label, f"status.allocation.devices.{key} is not a list")
    return value
