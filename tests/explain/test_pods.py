"""A Pod manifest given to explain: its claims found among the other files or in the cluster,
template entries made into claims as the resourceclaim controller would, all allocated together;
every way of naming a claim wrongly is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner, Result
from kubernetes import client

from agent.cli import main
from tests.explain.builders import CLASSES, NODE, claim, dgx_slice, exactly
from tests.fakes.apiserver import FakeAPIServer


def _pod(*entries: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": list(entries)}}
    if status:
        pod["status"] = status
    return pod


def _template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"metadata": {"labels": {"app": "t"}},
                     "spec": claim(exactly("gpu", count=count))["spec"]}}


def _explain(tmp_path: Path, docs: list[dict[str, Any]], *extra: str) -> Result:
    files = tmp_path / "input.yaml"
    files.write_text(yaml.safe_dump_all(docs))
    (tmp_path / "slices.yaml").write_text(yaml.safe_dump(dgx_slice()))
    (tmp_path / "classes.yaml").write_text(yaml.safe_dump_all(CLASSES))
    return CliRunner().invoke(main, [
        "explain", "-f", str(files), "--slices", str(tmp_path / "slices.yaml"),
        "--class", str(tmp_path / "classes.yaml"), "--node-name", NODE, "-o", "json", *extra,
    ], catch_exceptions=False)


def test_a_pods_claims_and_templates_are_allocated_together(tmp_path: Path) -> None:
    docs = [_pod({"name": "gpus", "resourceClaimTemplateName": "three"},
                 {"name": "more", "resourceClaimName": "one"}),
            _template("three", 3), claim(exactly("gpu", count=1), name="one")]
    out = _explain(tmp_path, docs)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    claims = {c["claim"]: c for c in data["claims"]}
    assert list(claims) == ["default/trainer-gpus", "default/one"]
    chosen = [r["device"] for c in claims.values()
              for r in c["allocation"]["devices"]["results"]]
    assert len(chosen) == len(set(chosen)) == 4  # the pod's claims never share a device


def test_together_they_do_not_fit_where_each_alone_would(tmp_path: Path) -> None:
    docs = [_pod({"name": "a", "resourceClaimTemplateName": "two"},
                 {"name": "b", "resourceClaimTemplateName": "three"}),
            _template("two", 2), _template("three", 3)]  # 4 GPUs: each fits alone
    out = _explain(tmp_path, docs)
    assert out.exit_code == 1, out.output


def test_the_claim_the_controller_made_is_used_when_the_status_names_it(tmp_path: Path) -> None:
    made = claim(exactly("gpu", count=1), name="trainer-gpus-x7k2p")
    docs = [_pod({"name": "gpus", "resourceClaimTemplateName": "six"},
                 status={"resourceClaimStatuses": [
                     {"name": "gpus", "resourceClaimName": "trainer-gpus-x7k2p"}]}), made]
    out = _explain(tmp_path, docs)  # the template itself is not needed then
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["claim"] == "default/trainer-gpus-x7k2p"


def _one_error_line(out: Result) -> str:
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.output
    return lines[0]


def test_a_claim_not_among_the_files_names_the_pods_entry(tmp_path: Path) -> None:
    line = _one_error_line(_explain(tmp_path, [_pod({"name": "g", "resourceClaimName": "gone"})]))
    assert "input.yaml" in line and "spec.resourceClaims[0]" in line
    assert "ResourceClaim default/gone is not among the input files" in line


def test_bad_pods_are_one_line_each(tmp_path: Path) -> None:
    both = {"name": "g", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}
    cases = {
        "set exactly one of": [_pod(both)],
        "the Pod names no claims": [_pod()],
        "one Pod at a time": [_pod({"name": "g", "resourceClaimName": "two"}), _pod(),
                              claim(exactly("gpu"), name="two")],
        "is not one of pod default/trainer's claims": [
            _pod({"name": "g", "resourceClaimName": "two"}), claim(exactly("gpu"), name="two"),
            claim(exactly("gpu"), name="stray")],
        "each entry needs a name": [_pod({"resourceClaimName": "two"})],
    }
    for expected, docs in cases.items():
        assert expected in _one_error_line(_explain(tmp_path, docs)), expected


def test_a_bad_template_points_at_its_own_line(tmp_path: Path) -> None:
    bad = _template("six", 6)
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = "many"
    line = _one_error_line(_explain(tmp_path, [_pod({"name": "g",
                                                     "resourceClaimTemplateName": "six"}), bad]))
    assert "input.yaml:" in line and "count" in line


def test_from_cluster_finds_the_pods_claims_there(tmp_path: Path) -> None:
    with FakeAPIServer() as srv:
        api = client.ResourceV1Api(srv.api_client())
        api.create_resource_slice(dgx_slice())
        for cls in CLASSES:
            api.create_device_class(cls)
        api.create_namespaced_resource_claim("default", claim(exactly("gpu", count=2),
                                                              name="two"))
        srv.put_object({**_template("six", 2), "metadata": {"name": "six",
                                                            "namespace": "default"}})
        pod = tmp_path / "pod.yaml"
        pod.write_text(yaml.safe_dump(_pod({"name": "a", "resourceClaimName": "two"},
                                           {"name": "b", "resourceClaimTemplateName": "six"},
                                           {"name": "c", "resourceClaimName": "absent"})))
        argv = ["explain", "-f", str(pod), "--slices", "from-cluster", "--kubeconfig",
                str(srv.write_kubeconfig(tmp_path / "kubeconfig")), "--node-name", NODE]
        out = CliRunner().invoke(main, argv, catch_exceptions=False)
        assert "ResourceClaim default/absent does not exist in the cluster" in \
            _one_error_line(out)
        pod.write_text(yaml.safe_dump(_pod({"name": "a", "resourceClaimName": "two"},
                                           {"name": "b", "resourceClaimTemplateName": "six"})))
        out = CliRunner().invoke(main, [*argv, "-o", "json"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert [c["claim"] for c in json.loads(out.output)["claims"]] == [
            "default/two", "default/trainer-b"]
