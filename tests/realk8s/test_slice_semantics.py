"""The embedded controller's generation and retry rules against a real API server.

The same rules as upstream's resourceslice controller at 1.37 (agent/slices/sync.py lists
them and the deliberate differences): a new pool starts at generation 1, a re-created slice
bumps every slice of the pool, shrinking does not bump, allNodes is never implied, and a pool
the server refuses (422) is retried with back-off until the server takes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from agent.common.metrics import Metrics
from agent.slices import Controller, Owner, PoolValidationError, RejectedSliceError, Timing, start
from agent.slices.sync import DesiredPool, SliceContent, desired_spec
from discovery.model import DriverResources, Pool
from tests.e2e.harness import DRIVER
from tests.realk8s.cluster import RealCluster, status_text
from tests.slices.helpers import pool_of
from tests.waiting import wait_for

FAST = Timing(event_delay_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.5, watch_timeout_s=30)
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@contextmanager
def controller(cluster: RealCluster, owner: Owner, resources: DriverResources,
               errors: list[Exception], timing: Timing = FAST,
               metrics: Metrics | None = None) -> Iterator[Controller]:
    c = start(cluster.admin, DRIVER, owner, resources, metrics=metrics or Metrics(),
              on_error=errors.append, timing=timing)
    try:
        yield c
    finally:
        c.stop()


def pool_slices(cluster: RealCluster, pool: str) -> list[dict[str, Any]]:
    return sorted((s for s in cluster.slices() if s["spec"]["driver"] == DRIVER
                   and s["spec"]["pool"]["name"] == pool), key=lambda s: s["metadata"]["name"])


def generations(cluster: RealCluster, pool: str) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in pool_slices(cluster, pool)}


def test_generation_rules_follow_upstream(cluster: RealCluster, node: str) -> None:
    errors: list[Exception] = []
    with controller(cluster, Owner(name=node), DriverResources({node: pool_of(8)}),
                    errors) as c:
        assert c.synced(20), errors
        assert generations(cluster, node) == {1}  # a new pool starts at 1
        c.update(DriverResources({node: pool_of(200)}))  # one update and one create
        assert c.synced(20), errors
        assert generations(cluster, node) == {2} and len(pool_slices(cluster, node)) == 2
        victim = pool_slices(cluster, node)[1]["metadata"]["name"]
        resp = cluster.admin.request(
            "DELETE", f"/apis/resource.k8s.io/{cluster.resource_version}/resourceslices/{victim}")
        assert resp.status == 200, status_text(resp)
        wait_for(lambda: len(pool_slices(cluster, node)) == 2 and generations(cluster, node)
                 == {3}, what="the lost slice re-created, every slice at a new generation")
        c.update(DriverResources({node: pool_of(8)}))  # a delete and one update: no bump
        assert c.synced(20), errors
        (only,) = pool_slices(cluster, node)
        assert only["spec"]["pool"]["generation"] == 3
        assert only["spec"]["pool"]["resourceSliceCount"] == 1
    assert errors == []


def test_all_nodes_is_never_implied(cluster: RealCluster, node: str) -> None:
    """The server refuses a slice without node selection; the agent refuses it first, in one
    line, and writes nothing."""
    pool = f"{node}-shared"
    bare = DesiredPool(pool, (SliceContent(tuple(pool_of(1).slices[0].devices)),))
    obj = {"apiVersion": f"resource.k8s.io/{cluster.resource_version}", "kind": "ResourceSlice",
           "metadata": {"generateName": "semantics-"}, "spec": desired_spec(DRIVER, bare, 0, 1)}
    if cluster.resource_version == "v1":
        resp = cluster.create_response(obj, query={"dryRun": "All"})
        assert resp.status == 422, status_text(resp)
    errors: list[Exception] = []
    owner = Owner(kind="ConfigMap", name="cfg", api_version="v1", uid="cfg-uid")
    with controller(cluster, owner, DriverResources({pool: pool_of(1)}), errors) as c:
        wait_for(lambda: errors, what="the refusal")
        (err,) = errors
        assert isinstance(err, PoolValidationError) and "no node selection" in str(err)
        assert "\n" not in str(err) and pool_slices(cluster, pool) == []
        selector = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}
        c.update(DriverResources({pool: Pool(pool_of(1).slices, node_selector=selector)}))
        assert c.synced(20), errors
        (published,) = pool_slices(cluster, pool)
        assert published["spec"]["nodeSelector"] == selector
        assert "allNodes" not in published["spec"]


def test_refused_pool_is_retried_until_the_server_takes_it(
    cluster: RealCluster, node: str
) -> None:
    """A ValidatingAdmissionPolicy refuses the pool (422, as an upgraded server's stricter
    validation would); once it is gone, the next retry publishes without any driver change."""
    name = f"semantics-{node}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"], "resources": ["resourceslices"]}]},
            "validations": [{"expression": f"object.spec.pool.name != '{node}'",
                             "message": "pool refused by the test policy"}]},
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    for path, obj in (("validatingadmissionpolicies", policy),
                      ("validatingadmissionpolicybindings", binding)):
        resp = cluster.admin.request("POST", f"{ADMISSION}/{path}", body=obj)
        assert resp.status == 201, status_text(resp)
    probe = {"apiVersion": f"resource.k8s.io/{cluster.resource_version}",
             "kind": "ResourceSlice", "metadata": {"generateName": "probe-"},
             "spec": desired_spec(DRIVER, DesiredPool(node, (SliceContent(),), node_name=node),
                                  0, 1)}
    wait_for(lambda: cluster.create_response(probe, query={"dryRun": "All"}).status == 422,
             what="the policy in force")
    errors: list[Exception] = []
    metrics = Metrics()

    def refused() -> float:
        value = metrics.registry.get_sample_value(
            "dra_agent_resourceslice_writes_total", {"verb": "create", "result": "invalid"})
        return value or 0.0

    try:
        with controller(cluster, Owner(name=node), DriverResources({node: pool_of(4)}),
                        errors, replace(FAST, rejected_retry_max_s=0.3), metrics) as c:
            wait_for(lambda: refused() >= 4, what="the refused create retried")
            assert pool_slices(cluster, node) == [] and not c.synced(0)
            (err,) = errors  # said once, however often it was retried
            assert isinstance(err, RejectedSliceError) and "\n" not in str(err)
            assert "pool refused by the test policy" in str(err)
            cluster.admin.request("DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
            assert c.synced(30), errors
            assert generations(cluster, node) == {1} and len(errors) == 1
    finally:
        cluster.admin.request("DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
        cluster.admin.request("DELETE", f"{ADMISSION}/validatingadmissionpolicies/{name}")
