"""The fake's DRAListTypeAttributes gate (the agent's numaNode probe depends on it): on, list
values are kept; off (the default, as on a real 1.37 server), dropped and then refused, on a
dry run too, which stores nothing."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.apiserver.conftest import fails, make_slice, raw
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.apiserver.__main__ import main


def _listed(name: str) -> dict[str, object]:
    body = make_slice(name)
    body["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/numaNode"] = {
        "ints": [0, 2]}
    return body


def test_gate_on_keeps_list_values_and_a_dry_run_stores_nothing() -> None:
    with FakeAPIServer(feature_gates={"DRAListTypeAttributes": True}) as srv:
        rapi = client.ResourceV1Api(srv.api_client())
        out = raw(rapi.create_resource_slice, _listed("s1"), dry_run="All")
        assert out["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/numaNode"] == {
            "ints": [0, 2]}
        assert srv.list_objects("resourceslices") == []


def test_gate_off_refuses_the_value_less_attribute_on_a_dry_run() -> None:
    with FakeAPIServer() as srv:
        rapi = client.ResourceV1Api(srv.api_client())
        code, status = fails(rapi.create_resource_slice, _listed("s1"), dry_run="All")
        assert code == 422
        assert status["details"]["causes"][0]["field"] == (
            "spec.devices[0].attributes[resource.kubernetes.io/numaNode]")


@pytest.mark.parametrize("bad", ["DRAListTypeAttributes", "Nope=true", "DRAListTypeAttributes=1"])
def test_the_command_line_refuses_a_bad_gate_in_one_line(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--feature-gates", bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--feature-gates" in err[-1] and "Traceback" not in "\n".join(err)
