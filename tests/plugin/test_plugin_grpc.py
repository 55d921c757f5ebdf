"""The plugin as the kubelet sees it: registration and prepare/unprepare over real sockets."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agent.checkpoint.codec import decode
from agent.checkpoint.model import ClaimState
from tests.fakes.kubelet import KubeletStandIn
from tests.plugnode import DRIVER, NODE, Node, build_node, make_claim, ref


def spec_of(node: Node, claim: dict) -> dict:
    uid = claim["metadata"]["uid"]
    return json.loads((node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").read_text())


def checkpoint_claims(node: Node) -> dict:
    if not node.checkpoint.exists():
        return {}
    return dict(decode(node.checkpoint.read_bytes()).claims)


def test_registration_advertises_v1_first_and_the_absolute_endpoint(node: Node) -> None:
    reg = node.kubelet.registered(DRIVER)
    assert reg is not None
    assert reg.service == "v1.DRAPlugin"
    assert reg.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert reg.endpoint == str(node.options.kubelet_dir / "plugins" / DRIVER / "dra.sock")
    assert node.server.registered and node.server.serving
    for path in (Path(reg.endpoint), reg.socket_path):
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o600


def test_v1beta1_kubelet_is_served_by_the_same_implementation(node: Node) -> None:
    with KubeletStandIn(node.options.kubelet_dir / "plugins_registry",
                        known_services=("v1beta1.DRAPlugin",)) as old:
        assert old.wait_registered(DRIVER).service == "v1beta1.DRAPlugin"
        claim = node.book.put(make_claim("c1", ["gpu-0"]))
        result = old.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
        assert result.ok, result.error
        assert [d.device_name for d in result.devices] == ["gpu-0"]
        assert result.devices[0].share_id is None
        assert old.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok


def test_prepare_single_device_claim(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-3"]))
    uid = claim["metadata"]["uid"]
    result = node.prepare(claim)[uid]
    assert result.ok, result.error
    (dev,) = result.devices
    assert (dev.request_names, dev.pool_name, dev.device_name) == (("req",), NODE, "gpu-3")
    assert dev.cdi_device_ids == (f"k8s.{DRIVER}/claim={uid}-gpu-3",)
    spec = spec_of(node, claim)
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "DRA_AGENT_DEVICE_GPU_3_PCI_ADDRESS=0000:1b:00.0" in env
    rec = checkpoint_claims(node)[uid]
    assert rec.state is ClaimState.PREPARE_COMPLETED and rec.boot_id == "boot-1"
    assert rec.cdi_annotations == {f"cdi.k8s.io/{DRIVER}_{uid}": dev.cdi_device_ids[0]}


def test_prepare_multi_device_claim_strips_subrequests(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0", "gpu-1"], results=[
        {"request": "nic/fast", "driver": DRIVER, "pool": NODE, "device": "nic-0"}]))
    uid = claim["metadata"]["uid"]
    result = node.prepare(claim)[uid]
    assert result.ok, result.error
    assert sorted((d.device_name, d.request_names) for d in result.devices) == [
        ("gpu-0", ("req",)), ("gpu-1", ("req",)), ("nic-0", ("nic",))]
    assert len(spec_of(node, claim)["devices"]) == 3


def test_unprepare_removes_spec_and_record_and_is_idempotent(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    assert node.prepare(claim)[uid].ok
    del node.book.claims[("default", "c1")]  # the claim may be gone by now
    assert node.unprepare(claim)[uid].ok
    assert not list(node.cdi_dir.glob("*.json"))
    assert uid not in checkpoint_claims(node)
    assert node.unprepare(claim)[uid].ok  # unknown claim: still success


def test_repeated_prepare_gives_the_same_answer(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0", "gpu-1"]))
    uid = claim["metadata"]["uid"]
    first = node.prepare(claim)[uid]
    mtime = (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").stat().st_mtime_ns
    assert node.prepare(claim)[uid] == first
    assert (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").stat().st_mtime_ns == mtime


def test_two_claims_in_one_call_each_get_an_entry_even_when_one_fails(node: Node) -> None:
    good = node.book.put(make_claim("good", ["gpu-0"]))
    bad = node.book.put(make_claim("bad", ["gpu-99"]))
    out = node.prepare(good, bad)
    assert out[good["metadata"]["uid"]].ok
    err = out[bad["metadata"]["uid"]].error
    assert "gpu-99" in err and "default/bad" in err and "does not exist" in err


def test_claim_with_results_of_two_drivers_prepares_only_ours(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"], results=[
        {"request": "other", "driver": "other.example.com", "pool": "p", "device": "x"}]))
    result = node.prepare(claim)[claim["metadata"]["uid"]]
    assert [d.device_name for d in result.devices] == ["gpu-0"]


def test_replaced_claim_is_refused(node: Node) -> None:
    claim = make_claim("c1", ["gpu-0"])
    node.book.put(make_claim("c1", ["gpu-0"]))  # same name, new UID
    err = node.prepare(claim)[claim["metadata"]["uid"]].error
    assert "different claim" in err and "re-created" in err


def test_unallocated_and_missing_claims_are_refused(node: Node) -> None:
    pending = node.book.put(make_claim("pending", allocated=False))
    gone = make_claim("gone", ["gpu-0"])
    out = node.prepare(pending, gone)
    assert "not allocated" in out[pending["metadata"]["uid"]].error
    assert "not found" in out[gone["metadata"]["uid"]].error
    assert node.metrics.registry.get_sample_value(
        "dra_agent_claim_errors_total", {"operation": "prepare", "reason": "not_allocated"}) == 1


def test_device_taken_by_another_claim_is_refused(node: Node) -> None:
    first = node.book.put(make_claim("first", ["gpu-0"]))
    second = node.book.put(make_claim("second", ["gpu-0"]))
    assert node.prepare(first)[first["metadata"]["uid"]].ok
    err = node.prepare(second)[second["metadata"]["uid"]].error
    assert "already prepared for claim default/first" in err
    assert not (node.cdi_dir / f"k8s.{DRIVER}-claim_{second['metadata']['uid']}.json").exists()
    assert node.unprepare(first)[first["metadata"]["uid"]].ok
    assert node.prepare(second)[second["metadata"]["uid"]].ok


def test_admin_access_may_use_a_taken_device(node: Node) -> None:
    user = node.book.put(make_claim("user", ["gpu-0"]))
    admin = node.book.put(make_claim("admin", results=[
        {"request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
         "adminAccess": True}]))
    assert node.prepare(user)[user["metadata"]["uid"]].ok
    assert node.prepare(admin)[admin["metadata"]["uid"]].ok
    env = spec_of(node, admin)["devices"][0]["containerEdits"]["env"]
    assert "DRA_AGENT_DEVICE_GPU_0_ADMIN_ACCESS=true" in env


def test_shared_device_with_share_ids(node: Node) -> None:
    from discovery.sharing import parse_sharing, shareable

    shared, _ = shareable(node.inventory[-1], parse_sharing("nic=shares:2"))
    assert shared is not None and shared.name == "nic-1"
    node.inventory[-1] = shared
    claims = [
        node.book.put(make_claim(f"s{i}", results=[
            {"request": "req", "driver": DRIVER, "pool": NODE, "device": "nic-1",
             "shareID": f"00000000-0000-0000-0000-00000000000{i}"}]))
        for i in range(2)
    ]
    for i, c in enumerate(claims):
        result = node.prepare(c)[c["metadata"]["uid"]]
        assert result.ok, result.error
        assert result.devices[0].share_id == f"00000000-0000-0000-0000-00000000000{i}"


def test_opaque_config_class_then_claim_later_wins(node: Node) -> None:
    def cfg(source: str, env: dict) -> dict:
        return {"source": source, "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "env": env}}}

    claim = node.book.put(make_claim("c1", ["gpu-0"], config=[
        cfg("FromClaim", {"MODE": "claim"}),
        cfg("FromClass", {"MODE": "class", "ONLY_CLASS": "1"}),
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {}}},
    ]))
    assert node.prepare(claim)[claim["metadata"]["uid"]].ok
    env = spec_of(node, claim)["devices"][0]["containerEdits"]["env"]
    assert "MODE=claim" in env and "ONLY_CLASS=1" in env


@pytest.mark.parametrize(("params", "named"), [
    ({"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "evn": {}}, "field evn"),
    ({"apiVersion": "dra-agent.io/v1alpha1", "kind": "GpuConfig"}, "field kind"),
    ({"apiVersion": "dra-agent.io/v9", "kind": "DeviceConfig"}, "field apiVersion"),
    ({"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "env": {"1X": "a"}},
     "field env.1X"),
    ("not an object", "field parameters"),
])
def test_bad_opaque_config_names_the_field(node: Node, params: object, named: str) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"], config=[
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]))
    err = node.prepare(claim)[claim["metadata"]["uid"]].error
    assert named in err and "request req" in err
    assert not list(node.cdi_dir.glob("*.json"))
    assert checkpoint_claims(node) == {}


def test_reboot_rewrites_the_lost_spec(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    first = node.prepare(claim)[uid]
    for f in node.cdi_dir.iterdir():
        f.unlink()  # /var/run is tmpfs
    (node.root / "boot_id").write_text("boot-2\n")
    node.restart()
    assert node.prepare(claim)[uid] == first
    assert spec_of(node, claim)["devices"][0]["name"] == f"{uid}-gpu-0"
    assert checkpoint_claims(node)[uid].boot_id == "boot-2"


def test_missing_spec_is_rewritten_without_reboot(node: Node) -> None:
    claim = node.book.put(make_claim("c1", ["gpu-0"]))
    uid = claim["metadata"]["uid"]
    node.prepare(claim)
    (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").unlink()
    assert node.prepare(claim)[uid].ok
    assert spec_of(node, claim)["devices"]


def test_second_agent_on_the_node_fails_fast(node: Node) -> None:
    from agent.plugin import AlreadyRunningError

    other = node.new_server()
    with pytest.raises(AlreadyRunningError, match="already serves"):
        other.start()
    other.stop(0)  # must not touch the running agent's sockets
    assert node.server.paths.registration.exists()
    assert node.server.serving  # the running agent keeps its sockets
    assert os.path.exists(node.server.paths.dra)


def test_restart_after_crash_replaces_stale_sockets(short_root: Path) -> None:
    import socket

    n = build_node(short_root)
    try:
        n.server.stop(0)
        stale = []
        for path in (n.server.paths.dra, n.server.paths.registration):
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(path))  # left behind by a SIGKILLed agent: nobody answers
            stale.append(s)
        n.restart()
        claim = n.book.put(make_claim("c1", ["gpu-0"]))
        assert n.prepare(claim)[claim["metadata"]["uid"]].ok
        for s in stale:
            s.close()
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_stop_removes_both_sockets(short_root: Path) -> None:
    n = build_node(short_root)
    n.kubelet.stop()
    n.server.stop(0)
    assert not n.server.paths.dra.exists() and not n.server.paths.registration.exists()
