"""--mig dynamic: MIG-mode GPUs published as shared counters plus every partition they have
room for (KEP-4815), on the simulated dgx-h100-mig and dgx-a100-mig-room machines."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from agent.slices.validate import validate_pool
from discovery.model import Device, Inventory
from discovery.partitions import OwnedKey, partition_of
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.sources import Sources

Src = Callable[[str], Sources]
EMPTY_H100 = {"1g10gb": 7, "1g10gbme": 7, "1g20gb": 4, "2g20gb": 3, "3g40gb": 2, "4g40gb": 1,
              "7g80gb": 1}


def dynamic(sources: Sources, owned: Collection[OwnedKey] = ()) -> Inventory:
    return discover(sources, DiscoveryOptions(mig="dynamic", mig_owned=lambda: owned))


def partitions(inv: Inventory, gpu: str) -> list[Device]:
    return [d for d in inv.devices if d.name.startswith(f"{gpu}-mig-") and partition_of(d)]


def test_static_mode_offers_only_the_instances_that_exist(profile_sources: Src) -> None:
    inv = discover(profile_sources("dgx-h100-mig"), DiscoveryOptions())
    assert sorted(d.name for d in inv.devices if d.type == "mig") == [
        "gpu-4-mig-3g40gb-0", "gpu-5-mig-1g10gb-0", "gpu-5-mig-1g10gb-1"]
    assert [d.name for d in inv.devices if d.type == "gpu"] == ["gpu-6", "gpu-7"]
    assert not inv.counter_sets
    assert {f"gpu-{i}" for i in range(6)} <= set(inv.reserved)


def test_an_empty_h100_offers_every_profile_at_every_placement(profile_sources: Src) -> None:
    inv = dynamic(profile_sources("dgx-h100-mig"))
    counts: dict[str, int] = {}
    for d in partitions(inv, "gpu-0"):
        profile = d.name.split("-")[3]
        counts[profile] = counts.get(profile, 0) + 1
    assert counts == EMPTY_H100
    three = inv.by_name()["gpu-0-mig-3g40gb-4"]
    assert three.attributes["profile"] == "3g.40gb" and three.attributes["partition"] is True
    assert three.attributes["placementStart"] == 4 and "uuid" not in three.attributes
    api = three.to_api()
    assert api["consumesCounters"] == [{"counterSet": "gpu-0-mig", "counters": {
        "compute-slices": {"value": "3"}, "copy-engines": {"value": "3"},
        "decoders": {"value": "3"}, "jpeg-engines": {"value": "3"},
        "memory": {"value": "40448Mi"}, "memory-slice-4": {"value": "1"},
        "memory-slice-5": {"value": "1"}, "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"}}}]
    sets = {c.name: c for c in inv.counter_sets}
    assert set(sets) == {f"gpu-{i}-mig" for i in range(6)}
    assert dict(sets["gpu-0-mig"].counters) == {
        **{f"memory-slice-{i}": "1" for i in range(8)}, "memory": "81152Mi",
        "compute-slices": "7", "copy-engines": "8", "decoders": "7", "jpeg-engines": "7",
        "ofa-engines": "1"}


def test_foreign_instances_stay_published_and_block_their_placements(
    profile_sources: Src,
) -> None:
    inv = dynamic(profile_sources("dgx-h100-mig"))
    names = inv.by_name()
    assert partition_of(names["gpu-4-mig-3g40gb-0"]) is None  # the foreign 3g, as it is
    assert str(names["gpu-4-mig-3g40gb-0"].attributes["uuid"]).startswith("MIG-")
    gpu4 = partitions(inv, "gpu-4")
    assert gpu4 and all(int(d.attributes["placementStart"]) >= 4 for d in gpu4)  # type: ignore[arg-type]
    counters = next(c for c in inv.counter_sets if c.name == "gpu-4-mig").counters
    assert sorted(k for k in counters if k.startswith("memory-slice")) == [
        f"memory-slice-{i}" for i in range(4, 8)]
    assert counters["compute-slices"] == "4" and counters["memory"] == "40704Mi"
    # gpu-5: two foreign 1g at 0 and 1: the 2g at 0 and every 7g/4g are gone.
    gpu5 = {d.name for d in partitions(inv, "gpu-5")}
    assert "gpu-5-mig-2g20gb-2" in gpu5 and "gpu-5-mig-2g20gb-0" not in gpu5
    assert not any("7g" in n or "4g" in n for n in gpu5)


def test_instances_dra_agent_made_keep_the_published_partitions(profile_sources: Src) -> None:
    sources = profile_sources("dgx-h100-mig")
    assert sources.gpu is not None
    uuid = next(g.uuid for g in sources.gpu.gpus if g.index == 4)  # type: ignore[attr-defined]
    inv = dynamic(sources, owned={(uuid, 9, 0)})
    names = {d.name for d in partitions(inv, "gpu-4")}
    assert {"gpu-4-mig-3g40gb-0", "gpu-4-mig-7g80gb-0", "gpu-4-mig-1g10gb-0"} <= names
    assert partition_of(inv.by_name()["gpu-4-mig-3g40gb-0"]) is not None  # not the static one
    counters = next(c for c in inv.counter_sets if c.name == "gpu-4-mig").counters
    assert counters["compute-slices"] == "7"


def test_partitions_publish_in_valid_slices_with_counters_apart(profile_sources: Src) -> None:
    inv = dynamic(profile_sources("dgx-h100-mig"))
    pool = build_resources(inv, "node-1").pools["node-1"]
    assert pool.slices[0].shared_counters and not pool.slices[0].devices
    assert len(pool.slices[0].shared_counters) == 6
    assert all(len(s.devices) <= 64 for s in pool.slices[1:])
    assert all(not s.shared_counters for s in pool.slices[1:])
    assert sum(len(s.devices) for s in pool.slices) == len(inv.devices)
    assert validate_pool("dra-agent.io", "node-1", pool) == []


def test_gpus_without_mig_mode_are_whole_and_discover_says_how(profile_sources: Src) -> None:
    inv = dynamic(profile_sources("dgx-h100-mig"))
    assert "gpu-6" in inv.by_name()
    hint = [w for w in inv.warnings if w.startswith("gpu-6:")]
    assert hint and "nvidia-smi -i 0000:d1:00.0 -mig 1" in hint[0]
    assert not [w for w in discover(profile_sources("dgx-h100-mig")).warnings
                if "MIG mode off" in w]  # static mode says nothing


def test_a100_room_beside_a_foreign_3g(profile_sources: Src) -> None:
    inv = dynamic(profile_sources("dgx-a100-mig-room"))
    gpu2 = {d.name for d in partitions(inv, "gpu-2")}
    assert gpu2 == {"gpu-2-mig-1g10gb-0", "gpu-2-mig-1g10gb-1", "gpu-2-mig-1g10gb-2",
                    "gpu-2-mig-1g10gb-3", "gpu-2-mig-1g10gbme-0", "gpu-2-mig-1g10gbme-1",
                    "gpu-2-mig-1g10gbme-2", "gpu-2-mig-1g10gbme-3", "gpu-2-mig-1g20gb-0",
                    "gpu-2-mig-1g20gb-2", "gpu-2-mig-2g20gb-0", "gpu-2-mig-2g20gb-2",
                    "gpu-2-mig-4g40gb-0", "gpu-2-mig-3g40gb-0"}
    # A full A100 (GPU 0: seven 1g) has no room: no counter set, no partitions.
    assert not partitions(inv, "gpu-0") and "gpu-0-mig" not in {c.name for c in inv.counter_sets}
    assert len(partitions(inv, "gpu-3")) == 25


def test_an_nvml_error_reading_placements_skips_that_gpu_with_a_warning(
    profile_sources: Src,
) -> None:
    from discovery.gpulib import GpuIsLostError

    sources = profile_sources("dgx-h100-mig")
    lib = sources.gpu
    assert lib is not None
    uuid = next(g.uuid for g in lib.gpus if g.index == 1)  # type: ignore[attr-defined]
    lib.fail("gpu_instance_possible_placements",  # type: ignore[attr-defined]
             GpuIsLostError("GPU is lost", call="gpu_instance_possible_placements"), uuid)
    try:
        inv = dynamic(sources)
    finally:
        lib.clear_faults()  # type: ignore[attr-defined]
    assert not partitions(inv, "gpu-1") and partitions(inv, "gpu-0")
    assert any(w.startswith("gpu-1: MIG placements unreadable") for w in inv.warnings)


def test_an_unknown_mig_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown MIG mode 'auto'"):
        DiscoveryOptions(mig="auto")


def _discover(*args: str) -> Any:
    from click.testing import CliRunner

    from agent.cli import main

    return CliRunner().invoke(main, ["discover", "--node-name", "node-a", *args])


def test_discover_mig_dynamic_prints_counter_slices_first() -> None:
    import json

    result = _discover("--simulate", "dgx-h100-mig", "--mig", "dynamic", "-o", "json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    assert items[0]["spec"]["sharedCounters"] and "devices" not in items[0]["spec"]
    assert all("sharedCounters" not in i["spec"] for i in items[1:])
    assert {i["spec"]["pool"]["resourceSliceCount"] for i in items} == {len(items)}


def test_mig_mode_from_the_config_file_and_bad_values_are_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("mig: dynamic\nsimulate: dgx-h100-mig\n")
    result = _discover("--config", str(good))
    assert result.exit_code == 0 and "gpu-0-mig-7g80gb-0" in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("mig: auto\n")
    result = _discover("--config", str(bad))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: config file {bad}: mig: must be one of static, dynamic, not 'auto' "
        "(see 'main discover -h')"]  # CliRunner names the program 'main'
    result = _discover("--simulate", "dgx-h100-mig", "--mig", "on")
    assert result.exit_code == 2 and "'on' is not one of 'static', 'dynamic'" in result.output
