"""The agent's API path never imports the ``kubernetes`` package (issue 7: idle RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.apiserver import FakeAPIServer

SCRIPT = """
import json, sys
from agent.kube.client import api_client
from agent.slices.api import KubeSliceClient
from agent.plugin.apiclaims import APIClaimSource
from agent.claim.status import ClaimStatusWriter
import agent.daemon, agent.slices, agent.plugin

http = api_client(sys.argv[1])
versions = KubeSliceClient(http).served_versions()
APIClaimSource(http)
ClaimStatusWriter(http, "gpu.example.com", "node")
print(json.dumps({"versions": versions,
                  "loaded": sorted(m for m in sys.modules
                                   if m.split(".")[0] in ("kubernetes", "pydantic", "requests",
                                                          "dateutil", "oauthlib"))}))
"""


def test_the_agent_talks_to_the_server_without_importing_kubernetes(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    with FakeAPIServer() as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(kubeconfig)], cwd=root,
                             capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout)
    assert result == {"versions": ["v1"], "loaded": []}
