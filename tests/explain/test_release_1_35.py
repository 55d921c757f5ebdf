"""--kubernetes-version 1.35: what 1.35's allocator does differently beyond its gates
(agent.explain.features.Release), and distinctAttribute without DRAConsumableCapacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.explain.api import explain
from tests.explain.builders import CLASSES, NODE, claim, device, exactly, slice_

_OPAQUE = {"driver": "gpu.dra-agent.io", "parameters": {"x": 1}}
_TWO = claim(exactly("a"), exactly("b"), config=[{"requests": ["a", "b"], "opaque": _OPAQUE}])
_SLICES = [slice_([device("gpu-0"), device("gpu-1", root="pci0000:16")])]


def _config(result: Any) -> list[dict[str, Any]]:
    assert result.fits and result.allocation is not None
    out: list[dict[str, Any]] = result.allocation["devices"].get("config") or []
    return out


def test_a_claim_config_naming_two_requests_is_copied_per_request_in_1_35() -> None:
    new = _config(explain(_TWO, CLASSES, _SLICES, NODE))
    assert new == [{"source": "FromClaim", "opaque": _OPAQUE}]  # names every request: cleared
    old = _config(explain(_TWO, CLASSES, _SLICES, NODE, kubernetes_version="1.35"))
    assert old == [{"source": "FromClaim", "requests": ["a", "b"], "opaque": _OPAQUE}] * 2


def test_the_command_replays_the_release_it_is_told(tmp_path: Path) -> None:
    files = {}
    for k, objs in {"c": [_TWO], "k": CLASSES, "s": _SLICES}.items():
        files[k] = tmp_path / f"{k}.yaml"
        files[k].write_text(yaml.safe_dump_all(objs))
    argv = ["explain", "-f", str(files["c"]), "--class", str(files["k"]), "--slices",
            str(files["s"]), "--node-name", NODE, "-o", "json", "--kubernetes-version", "1.35"]
    out = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)["allocation"]["devices"]["config"]) == 2


def test_distinct_attribute_needs_consumable_capacity() -> None:
    c = claim(exactly("a"), exactly("b"),
              constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert explain(c, CLASSES, _SLICES, NODE).fits
    off = explain(c, CLASSES, _SLICES, NODE, kubernetes_version="1.35")
    assert not off.fits and off.error is not None and "DRAConsumableCapacity" in off.error
    assert explain(c, CLASSES, _SLICES, NODE, kubernetes_version="1.35",
                   feature_gates="DRAConsumableCapacity=true").fits
