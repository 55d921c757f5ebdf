"""`dra-agent run` against an API server that does not answer: one line that sums it up, no
third-party retry warnings, and no "agent ready" while /readyz says the slices are not in sync;
a kubeconfig that cannot be used stops the agent before discovery or any monitor starts."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.daemon.test_run import Agent, free_port, workdir

__all__ = ["workdir"]  # the fixture, used by name below


def _kubeconfig(path: Path, server: str) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }))
    return str(path)


def test_unreachable_api_server_is_one_line_and_not_ready(workdir: Path) -> None:
    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    agent = Agent(workdir, _kubeconfig(workdir / "kubeconfig", server), "--no-health")
    try:
        agent.wait_http("/healthz")
        # Discovery retries from 0.2 s, doubling: several retries happen in this pause.
        time.sleep(3)
        status, body = agent.url("/readyz")
        assert status == 503 and "ResourceSlices not yet in sync" in body
    finally:
        agent.terminate()
    lines = agent.logs().splitlines()
    outage = [ln for ln in lines if "unreachable" in ln]
    assert len(outage) == 1, "\n".join(lines)
    assert f"API server {server} unreachable: connection refused; retrying every ≤ 10 s" \
        in outage[0]
    assert not [ln for ln in lines if "urllib3" in ln or "Retrying" in ln], "\n".join(lines)
    assert not [ln for ln in lines if 'msg="agent ready"' in ln], "\n".join(lines)
    assert any("not ready until ResourceSlices are in sync" in ln for ln in lines)


def test_unusable_kubeconfig_stops_before_discovery(workdir: Path) -> None:
    bad = workdir / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: 5\n")
    agent = Agent(workdir, str(bad))
    assert agent.proc.wait(20) == 1
    logs = agent.logs()
    assert str(bad) in logs
    assert "devices discovered" not in logs and "health" not in logs, logs
