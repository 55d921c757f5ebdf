"""``--slices from-cluster`` against the fake API server, and the scheduler's PreBind step:
the allocation explain computes is accepted as the claim's ``status.allocation``."""

import json
from pathlib import Path

import yaml
from click.testing import CliRunner
from kubernetes import client

from agent.cli import main
from agent.explain import explain
from tests.explain.builders import CLASSES, NODE, allocated, claim, dgx_slice, exactly
from tests.fakes.apiserver import FakeAPIServer


def test_from_cluster_uses_the_nodes_slices_classes_and_allocated_claims(tmp_path: Path):
    with FakeAPIServer() as srv:
        api = client.ResourceV1Api(srv.api_client())
        api.create_resource_slice(dgx_slice())
        for cls in CLASSES:
            api.create_device_class(cls)
        held = allocated("train-0", "gpu-0")
        status = held.pop("status")
        held["spec"] = claim(exactly("r"))["spec"]
        api.create_namespaced_resource_claim("default", held)
        _send(api, "PUT", "train-0/status", {**held, "metadata": _meta(api, "train-0"),
                                               "status": status})
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        claim_file = tmp_path / "claim.yaml"
        claim_file.write_text(yaml.safe_dump(claim(exactly("gpu", count=4))))
        out = CliRunner().invoke(main, [
            "explain", "-f", str(claim_file), "--slices", "from-cluster",
            "--kubeconfig", str(kubeconfig), "--node-name", NODE, "-o", "json"],
            catch_exceptions=False)
        assert out.exit_code == 1, out.output
        data = json.loads(out.output)
        assert "allocated to claim default/train-0" in data["suggestion"]


def test_the_allocation_is_a_valid_claim_status(tmp_path: Path):
    with FakeAPIServer() as srv:
        api = client.ResourceV1Api(srv.api_client())
        c = claim(exactly("gpu", count=2, tolerations=[{"operator": "Exists"}]), name="job")
        api.create_namespaced_resource_claim("default", c)
        result = explain(c, CLASSES, [dgx_slice()], NODE)
        assert result.fits
        current = _meta(api, "job")
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": current, "spec": c["spec"],
                "status": {"allocation": result.allocation}}
        _send(api, "PUT", "job/status", body)
        stored = _send(api, "GET", "job")
        results = stored["status"]["allocation"]["devices"]["results"]
        assert [r["device"] for r in results] == ["gpu-0", "gpu-1"]


def _send(api: client.ResourceV1Api, verb: str, name: str, body: dict | None = None) -> dict:
    method, url, headers, wire, post = api.api_client.param_serialize(
        verb, f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}", body=body,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        auth_settings=["BearerToken"])
    response = api.api_client.call_api(method, url, header_params=headers, body=wire,
                                       post_params=post)
    data = json.loads(response.response.data)
    assert 200 <= response.status < 300, data
    return data


def _meta(api: client.ResourceV1Api, name: str) -> dict:
    return _send(api, "GET", name)["metadata"]
