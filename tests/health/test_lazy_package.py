"""``agent.health`` loads its parts on first use: ``run --no-health`` reads the options only,
and neither the monitor nor the health stream's protobuf (nor their imports) is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _loaded(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def test_the_daemon_and_the_options_load_no_monitor() -> None:
    out = _loaded("import sys, agent.daemon, agent.health.options; print(sorted(m for m in "
                  "sys.modules if m.startswith(('agent.health.', 'protos.drahealth'))))")
    assert out == "['agent.health.model', 'agent.health.options', 'agent.health.xids']"


def test_names_load_on_first_use() -> None:
    import agent.health as health

    assert health.HealthMonitor.__module__ == "agent.health.monitor"
    assert health.HealthServicer.__module__ == "agent.health.stream"
    assert health.parse_xids("13") == frozenset({13})
    for name in health.__all__:
        assert getattr(health, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    import agent.health as health

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        health.Nope  # noqa: B018
