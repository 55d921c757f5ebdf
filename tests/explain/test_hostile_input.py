"""Whatever is handed to -f, --class, --slices or --allocated: exit 2 and one line on stderr,
never a traceback (exit 1 would read as "does not fit")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.explain.builders import CLASSES, NODE, claim, dgx_slice, exactly

HOSTILE: dict[str, bytes] = {
    "binary": bytes(range(256)) * 4,
    "latin1": "kind: ResourceClaim\nmetadata: {name: caf\xe9}\n".encode("latin-1"),
    "nul": b"kind: ResourceClaim\x00\n",
    "deep-list": b"[" * 50000 + b"]" * 50000,
    "deep-map": b"a: " + b"{a: " * 5000 + b"1" + b"}" * 5000,
    "scalar": b"42\n",
    "bad-yaml": b"kind: [unclosed\n",
    "wrong-claim": b"kind: ResourceClaim\nspec: {devices: {requests: [{name: 5}]}}\n",
    "wrong-slice": b"kind: ResourceSlice\nspec: {driver: d, pool: {name: p, generation: x}}\n",
    "wrong-attr": (b"kind: ResourceSlice\nspec: {driver: d, pool: {name: p}, nodeName: node-a, "
                   b"devices: [{name: x, attributes: {a: {strings: 5}}}]}\n"),
    "wrong-class": b"kind: DeviceClass\nmetadata: {name: x}\nspec: {selectors: {cel: 1}}\n",
    "wrong-result": (b"kind: ResourceClaim\nstatus: {allocation: {devices: {results: [{driver: "
                     b"a, pool: b, device: c, consumedCapacity: [1]}]}}}\n"),
    "wrong-status": b"kind: ResourceClaim\nstatus: {allocation: [1]}\n",
    "slice-as-claim": b"kind: ResourceSlice\nspec: {driver: d, pool: {name: p}}\n",
}
SLOTS = ("-f", "--class", "--slices", "--allocated")
# Valid there: an unallocated claim holds nothing, a slice without devices has none.
SKIP = {("--allocated", "wrong-claim"), ("--slices", "slice-as-claim")}


@pytest.fixture()
def good(tmp_path: Path) -> dict[str, str]:
    files = {"-f": [claim(exactly("g"))], "--class": CLASSES, "--slices": [dgx_slice()]}
    out = {}
    for slot, objs in files.items():
        p = tmp_path / f"good{slot}.yaml"
        p.write_text(yaml.safe_dump_all(objs))
        out[slot] = str(p)
    return out


def _cases() -> list[tuple[str, str]]:
    return [(slot, name) for slot in SLOTS for name in HOSTILE if (slot, name) not in SKIP]


@pytest.mark.parametrize(("slot", "name"), _cases())
def test_hostile_input_exits_2_with_one_line(tmp_path: Path, good: dict[str, str], slot: str,
                                             name: str) -> None:
    bad = tmp_path / name
    bad.write_bytes(HOSTILE[name])
    args = dict(good)
    args[slot] = str(bad)
    argv = ["explain", "--node-name", NODE]
    for k, v in args.items():
        argv += [k, v]
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output


def test_binary_on_stdin_exits_2(good: dict[str, str]) -> None:
    result = CliRunner().invoke(
        main, ["explain", "-f", "-", "--class", good["--class"], "--slices", good["--slices"],
               "--node-name", NODE], input=b"\xff\xfe\x00k", catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: <stdin>: not UTF-8 text (byte 0xff at offset 0)"


@pytest.mark.parametrize("gates", ["Foo", "DRAListTypeAttributes=maybe",
                                   "DRAAdminAccess=false", "DynamicResourceAllocation=false",
                                   "NotDRA=true"])
def test_bad_feature_gates_exit_2(good: dict[str, str], gates: str) -> None:
    result = CliRunner().invoke(
        main, ["explain", "-f", good["-f"], "--class", good["--class"], "--slices",
               good["--slices"], "--node-name", NODE, "--feature-gates", gates],
        catch_exceptions=False)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--feature-gates" in result.stderr
