"""A Pod manifest among explain's inputs: the claims it names, found as the kubelet finds them.

``spec.resourceClaims[]`` names each claim either directly (``resourceClaimName``) or through a
template (``resourceClaimTemplateName``). A direct name is looked up among the other input
documents, then in the cluster (``--slices from-cluster``). A template entry uses the claim the
resourceclaim controller made for it when the Pod's ``status.resourceClaimStatuses`` names one;
otherwise the claim is made here from the template as the controller would (its spec, the
``resource.kubernetes.io/pod-claim-name`` annotation, named ``<pod>-<entry>`` since the real
name's random suffix does not exist yet). All of them are then one pod's claims, allocated
together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.explain.docs import Doc, InputError

#: ``fetch(plural, namespace, name)``: the object from the cluster, None when it does not exist.
Fetch = Callable[[str, str, str], Mapping[str, Any] | None]

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def is_pod(doc: Doc) -> bool:
    return doc.obj.get("kind") == "Pod"


def claims_of_pod(docs: Sequence[Doc], fetch: Fetch | None) -> list[Doc | Mapping[str, Any]]:
    """The claims of the one Pod among ``docs``, in ``spec.resourceClaims`` order.

    The other documents are where its claims and templates are looked up; one the Pod does not
    use is an error (it would be silently left out of the answer otherwise).
    """
    pods = [d for d in docs if is_pod(d)]
    if len(pods) != 1:
        raise InputError(pods[1].where(), "explain takes one Pod at a time (its claims are "
                         "allocated together); give the others separately")
    (pod,) = pods
    others = [d for d in docs if d is not pod]
    meta = pod.obj.get("metadata") or {}
    pod_name, namespace = meta.get("name") or "", meta.get("namespace") or "default"
    entries = (pod.obj.get("spec") or {}).get("resourceClaims") or []
    if not isinstance(entries, list) or not entries:
        raise pod.error(("spec", "resourceClaims"), "the Pod names no claims")
    if not pod_name:
        raise pod.error(("metadata", "name"), "the Pod needs a name")
    generated = _generated_names(pod)
    lookup = _Lookup(pod, others, fetch, namespace)
    out: list[Doc | Mapping[str, Any]] = []
    for i, entry in enumerate(entries):
        path = ("spec", "resourceClaims", i)
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise pod.error(path, "each entry needs a name")
        name = str(entry["name"])
        direct, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if bool(direct) == bool(template):
            raise pod.error(path, f"{name}: set exactly one of resourceClaimName, "
                                  "resourceClaimTemplateName")
        claim_name = direct or generated.get(name)
        if claim_name:
            out.append(lookup.find(path, "ResourceClaim", "resourceclaims", str(claim_name)))
            continue
        found = lookup.find(path, "ResourceClaimTemplate", "resourceclaimtemplates",
                            str(template))
        out.append(_from_template(found, pod_name, name, namespace))
    unused = [d for i, d in enumerate(others) if i not in lookup.used]
    if unused:
        raise InputError(unused[0].where(), f"{_describe(unused[0])} is not one of pod "
                         f"{namespace}/{pod_name}'s claims (with a Pod, the other documents "
                         "are only its claims and templates)")
    return out


def _generated_names(pod: Doc) -> dict[str, str]:
    statuses = (pod.obj.get("status") or {}).get("resourceClaimStatuses") or []
    return {str(s["name"]): str(s["resourceClaimName"]) for s in statuses
            if isinstance(s, Mapping) and s.get("name") and s.get("resourceClaimName")}


def _describe(doc: Doc) -> str:
    meta = doc.obj.get("metadata") or {}
    return f"{doc.obj.get('kind') or 'a document'} {meta.get('name') or '(no name)'}"


@dataclass
class _Lookup:
    """Where a Pod's claims and templates are found: the other inputs, then the cluster."""

    pod: Doc
    docs: Sequence[Doc]
    fetch: Fetch | None
    namespace: str
    used: set[int] = field(default_factory=set)

    def find(self, path: tuple[Any, ...], kind: str, plural: str, name: str,
             ) -> Doc | Mapping[str, Any]:
        for i, doc in enumerate(self.docs):
            meta = doc.obj.get("metadata") or {}
            if (doc.obj.get("kind") or "ResourceClaim") == kind and meta.get("name") == name \
                    and (meta.get("namespace") or self.namespace) == self.namespace:
                self.used.add(i)
                return doc
        where = f"{kind} {self.namespace}/{name}"
        if self.fetch is not None:
            found = self.fetch(plural, self.namespace, name)
            if found is not None:
                return found
            raise self.pod.error(path, f"{where} does not exist in the cluster")
        raise self.pod.error(path, f"{where} is not among the input files (give it with -f, or "
                                   "read it from the cluster with --slices from-cluster)")


def _from_template(template: Doc | Mapping[str, Any], pod_name: str, entry: str,
                   namespace: str) -> Doc | Mapping[str, Any]:
    """What the resourceclaim controller would create; a template read from a file keeps its
    line numbers (the claim's spec sits at the same path, ``spec.spec``, as in the file)."""
    obj = template.obj if isinstance(template, Doc) else template
    inner = (obj.get("spec") or {}).get("metadata") or {}
    claim = {
        "apiVersion": obj.get("apiVersion") or "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{pod_name}-{entry}", "namespace": namespace,
                     "annotations": {**(inner.get("annotations") or {}), POD_CLAIM_NAME: entry}},
        "spec": obj.get("spec"),
    }
    if isinstance(template, Doc):
        return Doc(claim, template.source, template.lines, template.base)
    return claim
