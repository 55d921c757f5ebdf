"""--kubernetes-version 1.35: what 1.35's allocator does differently beyond its gates
(agent.explain.features.Release), and distinctAttribute without DRAConsumableCapacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.explain.api import explain, explain_pod
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


def test_a_pods_claims_backtrack_across_claims(tmp_path: Path) -> None:
    # Claim one takes either GPU; claim two needs gpu-0 (pcieRoot pci0000:15). Alone, one
    # takes gpu-0; together the search goes back into claim one and gives it gpu-1.
    one = claim(exactly("a"), name="one")
    two = claim(exactly("b", "gpu.dra-agent.io", None,
                        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"'),
                name="two")
    pod = explain_pod([one, two], CLASSES, _SLICES, NODE)
    assert pod.fits and [_devices(c) for c in pod.claims] == [["gpu-1"], ["gpu-0"]]
    assert not explain_pod([one, two, claim(exactly("c"), name="three")], CLASSES, _SLICES,
                           NODE).fits
    files = []
    for c in (one, two):
        files += ["-f", str(tmp_path / f"{c['metadata']['name']}.yaml")]
        Path(files[-1]).write_text(yaml.safe_dump(c))
    (tmp_path / "k.yaml").write_text(yaml.safe_dump_all(CLASSES))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump_all(_SLICES))
    base = ["explain", *files, "--class", str(tmp_path / "k.yaml"), "--slices",
            str(tmp_path / "s.yaml"), "--node-name", NODE]
    out = CliRunner().invoke(main, [*base, "-o", "json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert [c["claim"] for c in json.loads(out.output)["claims"]] == ["default/one",
                                                                       "default/two"]
    table = CliRunner().invoke(main, base, catch_exceptions=False).output
    assert table.startswith("pod's 2 claims on node node-a: fit together")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    bad = CliRunner().invoke(main, [*base, "-f", str(empty)], catch_exceptions=False)
    assert bad.exit_code == 2 and "no claim in the file" in bad.output


def _devices(result: Any) -> list[str]:
    return [r["device"] for r in result.allocation["devices"]["results"]]
