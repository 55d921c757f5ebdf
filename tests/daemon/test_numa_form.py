"""``run`` publishes numaNode in the form the API server takes, or the one the operator set
(``--numa-node-attribute``, flags > DRA_AGENT_* > config file > auto)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agent.commands.options import common_options, pop_config
from agent.common.config import Config
from agent.daemon import Daemon, RunOptions
from tests.fakes.apiserver import FakeAPIServer

DRIVER = "dra-agent.io"
NODE = "node-n"
NUMA = "resource.kubernetes.io/numaNode"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="n", dir="/tmp"))  # unix sockets want short paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def published_numa(gates: dict[str, bool], form: str, short: Path) -> tuple[set[str], int]:
    """The numaNode values of the GPUs the daemon published, and how many probes it sent."""
    with FakeAPIServer(feature_gates=gates) as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        cfg = Config(driver_name=DRIVER, node_name=NODE,
                     kubeconfig=str(srv.write_kubeconfig(short / "kubeconfig")),
                     kubelet_dir=short / "k", cdi_dir=short / "cdi", simulate="dgx-h100",
                     metrics_address="127.0.0.1:0", numa_node_attribute=form)
        daemon = Daemon(cfg, RunOptions(slow_rescan_s=3600), environ={})
        daemon.start()
        try:
            assert daemon.controller.synced(20)
            values = {json.dumps(d["attributes"][NUMA], sort_keys=True)
                      for o in srv.list_objects("resourceslices")
                      for d in o["spec"]["devices"] if d["name"].startswith("gpu-")}
            probes = sum(1 for r in srv.requests if r.query.get("dryRun") == "All")
        finally:
            daemon.shutdown()
    return values, probes


@pytest.mark.parametrize(("gate", "form", "expected", "probes"), [
    (True, "auto", {'{"ints": [0, 2]}', '{"ints": [1, 3]}'}, 1),
    (False, "auto", {'{"int": 0}', '{"int": 1}'}, 1),
    (True, "scalar", {'{"int": 0}', '{"int": 1}'}, 0),
])
def test_run_publishes_the_form_the_server_takes(short_dir: Path, gate: bool, form: str,
                                                 expected: set[str], probes: int) -> None:
    values, sent = published_numa({"DRAListTypeAttributes": gate}, form, short_dir)
    assert values == expected and sent == probes


@click.command()
@common_options
def show(**kwargs: Any) -> None:
    click.echo(pop_config(kwargs).numa_node_attribute)


def test_option_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    def value(args: list[str], env: dict[str, str]) -> str:
        result = CliRunner().invoke(show, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output.strip()

    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text("numa-node-attribute: list\n")
    file_env = {"DRA_AGENT_CONFIG": str(cfg_file)}
    assert value([], {}) == "auto"
    assert value([], file_env) == "list"
    assert value([], {**file_env, "DRA_AGENT_NUMA_NODE_ATTRIBUTE": "scalar"}) == "scalar"
    assert value(["--numa-node-attribute", "auto"],
                 {**file_env, "DRA_AGENT_NUMA_NODE_ATTRIBUTE": "scalar"}) == "auto"
    cfg_file.write_text("numa_node_attribute: scalar\n")  # snake_case too, like every key
    assert value([], file_env) == "scalar"
