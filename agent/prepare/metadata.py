"""Device metadata for workloads (KEP-5304): what goes in the file, and where it is.

At prepare, each request of a claim that our driver serves gets one ``DeviceMetadata``
document, bind-mounted read-only into the containers that use the request. The format, the
paths and the mount are the upstream kubelet plugin helper's of Kubernetes 1.37
(``k8s.io/dynamic-resource-allocation`` v0.37.2: ``api/metadata`` and
``kubeletplugin/metadata.go``), so consumers built on its ``devicemetadata`` decoder (KubeVirt
reads ``resource.kubernetes.io/pciBusID``) read ours unchanged:

* in the container: ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim
  name>/<request>/<driver>-metadata.json``, or ``resourceclaimtemplates/<podClaimName>/...``
  when the claim carries the ``resource.kubernetes.io/pod-claim-name`` annotation (a claim
  made from a template: the pod knows its entry's name, not the generated claim name);
* on the host: ``<plugin dir>/dra-device-metadata/<namespace>_<claim name>/<request>/
  metadata.json`` (mode 0644 in 0755 directories: the file is what a non-root container user
  reads through the bind mount; it holds only what the ResourceSlice already publishes);
* ``<request>`` in both paths is the base request; the document's request ``name`` keeps a
  subrequest (``gpu/large``), as the allocation result has it;
* the content: ``kind``/``apiVersion``, ``metadata`` (claim name, namespace, UID, generation
  1), ``podClaimName`` when annotated, and one request with its devices (driver, pool, name,
  the slice's attributes, a NIC's ``networkData``), encoded as Go's ``json.MarshalIndent(obj,
  "", "  ")`` writes it plus a newline.

Which apiVersion: the 1.37 helper writes one document per version the driver enables, newest
first, and refuses to start unless ``metadata.resource.k8s.io/v1beta1`` is among them;
``v1alpha1`` (1.36's, identical fields) is still accepted there but marked for removal. We
write the one document of ``v1beta1``: a single object any JSON reader parses, and what
upstream's stream decoder picks first anyway.

Kubernetes 1.35 (our oldest) has no such feature (v0.35.4 has no ``api/metadata`` and its
helper writes nothing): the file is then just one more read-only bind mount from our CDI spec,
which the runtime applies like any other; nothing in the kubelet looks at it, so it is harmless.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.claim.model import AllocatedDevice, ClaimRef
from agent.common.k8snames import dns_label_problem
from agent.prepare.devices import NETDEV_TYPES, SpecDevice, nic_status
from cdi.spec import Mount

API_VERSION = "metadata.resource.k8s.io/v1beta1"
KIND = "DeviceMetadata"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
#: Under the plugin directory, as the helper's ``metadataSubDir``.
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
#: The helper's mount options, in its order.
MOUNT_OPTIONS = ("ro", "bind")
#: The helper writes generation 1 at prepare (and bumps it only on a later update, which we
#: never make: our NIC facts are known at prepare). A rewrite after a reboot is a new prepare.
GENERATION = 1


@dataclass(frozen=True, slots=True)
class MetadataDevice:
    """One allocated device as the document lists it."""

    pool: str
    name: str
    #: API form (``{"model": {"string": ...}}``), exactly what the ResourceSlice publishes.
    attributes: Mapping[str, Any]
    #: ``NetworkDeviceData`` fields for a NIC (interfaceName, hardwareAddress), else None.
    network_data: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class MetadataFile:
    """One request's file: where it lives on the host, where the container sees it, and its
    bytes. ``request`` is the base request name (the path segment)."""

    request: str
    host_path: Path
    container_path: str
    content: bytes

    @property
    def mount(self) -> Mount:
        return Mount(host_path=str(self.host_path), container_path=self.container_path,
                     options=MOUNT_OPTIONS)


def file_name(driver: str) -> str:
    """``<driver>-metadata.json``: the driver name keeps two drivers of one request apart."""
    return driver + FILE_SUFFIX


def container_path(driver: str, claim_name: str, pod_claim_name: str | None,
                   request: str) -> str:
    # An empty annotation counts as absent, as the helper's check (non-nil and non-empty).
    if pod_claim_name:
        return f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{pod_claim_name}/{request}/{file_name(driver)}"
    return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim_name}/{request}/{file_name(driver)}"


def claim_dir(root: Path, namespace: str, name: str) -> Path:
    """The host directory of one claim's files; ``root`` is ``<plugin dir>/dra-device-metadata``.

    ``<namespace>_<name>`` is unambiguous: neither a DNS label nor a DNS subdomain holds '_'.
    """
    return root / f"{namespace}_{name}"


def host_path(root: Path, namespace: str, name: str, request: str) -> Path:
    return claim_dir(root, namespace, name) / request / HOST_FILE


def names_problem(ref: ClaimRef, pod_claim_name: str | None,
                  results: Sequence[AllocatedDevice]) -> str | None:
    """Why these names cannot become path segments, or None.

    The claim's namespace and name are checked before any work (``check_uid``). The request
    names and the annotation come from the claim too: the API server only allows DNS labels
    there, but the annotation is user-editable and a ``..`` or ``/`` must never reach a path.
    """
    if pod_claim_name and (why := dns_label_problem(pod_claim_name)) is not None:
        return (f"annotation resource.kubernetes.io/pod-claim-name {pod_claim_name!a} {why}; "
                "it names the pod's claim entry and must be a DNS label")
    for result in results:
        for part in result.request.split("/"):
            if (why := dns_label_problem(part)) is not None:
                return f"request name {result.request!a}: {part!a} {why}"
    return None


def network_data(result: AllocatedDevice, item: SpecDevice) -> dict[str, Any] | None:
    """A NIC's ``networkData``: the same facts its claim status entry gets (``nic_status``).

    Field order is ``NetworkDeviceData``'s (interfaceName, ips, hardwareAddress). IPs only
    where the claim's ``netdev.addresses`` gives the interface some (docs/netdev.md).
    """
    if item.device.type not in NETDEV_TYPES:
        return None
    nic = nic_status(result, item)
    out: dict[str, Any] = {}
    if nic.interface_name:
        out["interfaceName"] = nic.interface_name
    if nic.ips:
        out["ips"] = list(nic.ips)
    if nic.hardware_address:
        out["hardwareAddress"] = nic.hardware_address
    return out or None


def document(driver: str, ref: ClaimRef, pod_claim_name: str | None, request: str,
             devices: Sequence[MetadataDevice]) -> dict[str, Any]:
    """The v1beta1 ``DeviceMetadata`` object, keys in the Go struct's field order.

    ObjectMeta holds only name, namespace, uid and generation: in 1.37 its zero
    ``creationTimestamp`` is ``omitzero``, so the helper's files carry none.
    """
    doc: dict[str, Any] = {
        "kind": KIND,
        "apiVersion": API_VERSION,
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid,
                     "generation": GENERATION},
    }
    if pod_claim_name is not None:  # a pointer in Go: present, even empty, when annotated
        doc["podClaimName"] = pod_claim_name
    listed = []
    for device in devices:
        entry: dict[str, Any] = {"driver": driver, "pool": device.pool, "name": device.name}
        if device.attributes:
            # Go sorts map keys by their bytes; code point order is the same for UTF-8.
            entry["attributes"] = {k: device.attributes[k] for k in sorted(device.attributes)}
        if device.network_data is not None:
            entry["networkData"] = dict(device.network_data)
        listed.append(entry)
    req: dict[str, Any] = {"name": request}
    if listed:
        req["devices"] = listed
    doc["requests"] = [req]
    return doc


#: What Go's encoding/json escapes beyond what Python's does with ``ensure_ascii=False``.
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
               "\u2028": "\\u2028", "\u2029": "\\u2029"}


def encode(doc: Mapping[str, Any]) -> bytes:
    """Bytes as the helper writes them: indented by two spaces, UTF-8 (not ``\\u`` escapes),
    HTML characters escaped as Go does, one trailing newline.

    The extra escapes are applied to the encoded text: outside strings JSON has none of these
    characters, so each one found is inside a string, where the escape means the same.
    """
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    for raw, escaped in _GO_ESCAPES.items():
        text = text.replace(raw, escaped)
    return (text + "\n").encode()


def plan(driver: str, root: Path, ref: ClaimRef, *, pod_claim_name: str | None,
         results: Sequence[AllocatedDevice], devices: Sequence[SpecDevice]
         ) -> tuple[tuple[MetadataFile, ...], list[SpecDevice]]:
    """The claim's files, one per request, and ``devices`` (parallel to ``results``) with each
    file's mount on the first device of its request.

    The helper injects its mount's CDI ID into the first device of each request; the kubelet
    hands a container the CDI IDs of the requests it references, so the mount reaches exactly
    the containers using the request. Here the mount is part of that device's own edits.
    """
    by_request: dict[str, list[int]] = {}
    for index, result in enumerate(results):
        by_request.setdefault(result.request, []).append(index)
    files: list[MetadataFile] = []
    out = list(devices)
    for request, indexes in by_request.items():
        listed = [
            MetadataDevice(pool=results[i].pool, name=results[i].device,
                           attributes=devices[i].device.to_api()["attributes"],
                           network_data=network_data(results[i], devices[i]))
            for i in indexes
        ]
        base = results[indexes[0]].base_request
        content = encode(document(driver, ref, pod_claim_name, request, listed))
        file = MetadataFile(
            request=base, host_path=host_path(root, ref.namespace, ref.name, base),
            container_path=container_path(driver, ref.name, pod_claim_name, base),
            content=content,
        )
        files.append(file)
        first = out[indexes[0]]
        out[indexes[0]] = replace(first, mounts=(*first.mounts, file.mount))
    return tuple(files), out
