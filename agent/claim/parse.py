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

The types are ``agent.claim.model``; what can be written is ``agent.claim.writable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.claim.model import (
    POD_CLAIM_NAME_ANNOTATION,
    AllocatedDevice,
    Claim,
    ClaimError,
    ClaimRef,
    ClaimReplacedError,
    OpaqueConfig,
)
from agent.claim.writable import encodes, unwritable_path
from agent.common.quantity import is_quantity, parse_quantity


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


def _shown(text: str) -> str:
    """``text`` as is when it is printable, else escaped: one line, whatever the server sent."""
    return text if text.isprintable() else ascii(text)


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
