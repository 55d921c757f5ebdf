"""A PF and its VFs are prepared for one claim at a time (#28, finding 4), the driver's
second line of defence beside the counter sets the scheduler is given under --vfs dynamic
(tests/explain/test_pf_and_vfs.py): here on a static node (sriov-nic, VFs made by the
operator), whose slices say nothing of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.claim.parse import parse_claim
from agent.prepare import DevicePreparer
from agent.prepare.errors import DeviceTakenError
from discovery.scan import discover
from discovery.simulate import simulated_sources
from tests.plugnode import DRIVER, NODE, device_preparer, make_claim

PF = "nic-0000-3b-00-0"
VF = "vf-0000-3b-00-2"  # VF 0 of PF 0000:3b:00.0
OTHER_PFS_VF = "vf-0000-3b-08-2"  # VF 0 of PF 0000:3b:00.1


@pytest.fixture
def preparer(tmp_path: Path) -> DevicePreparer:
    found = discover(simulated_sources("sriov-nic", tmp_path / "sim"))
    assert found.by_name()[VF].host.parent_pf == found.by_name()[PF].host.pci_address
    assert found.by_name()[OTHER_PFS_VF].host.parent_pf != found.by_name()[PF].host.pci_address
    return device_preparer(tmp_path, lambda: found)


def admin(name: str, device: str) -> dict[str, Any]:
    return make_claim(name, results=[{"request": "req", "driver": DRIVER, "pool": NODE,
                                      "device": device, "adminAccess": True}])


@pytest.mark.parametrize(("first", "second", "relation"), [
    (PF, VF, "is a VF of PF"), (VF, PF, "is the PF of VF")])
def test_a_pf_and_its_vf_are_never_prepared_for_two_claims(
        preparer: DevicePreparer, first: str, second: str, relation: str) -> None:
    holder = preparer.prepare(parse_claim(make_claim("holder", [first])))
    with pytest.raises(DeviceTakenError) as err:
        preparer.prepare(parse_claim(make_claim("tenant", [second])))
    line = str(err.value)
    assert f"device {NODE}/{second} {relation} {first}, which is prepared for claim " \
           f"default/holder ({holder.uid})" in line and "\n" not in line
    assert set(preparer.checkpoint.claims()) == {holder.uid}
    # Once the holder is gone, the other is free; the other PF's VF was free all along.
    assert preparer.prepare(parse_claim(make_claim("other", [OTHER_PFS_VF]))).completed
    preparer.unprepare(holder.uid)
    assert preparer.prepare(parse_claim(make_claim("tenant", [second]))).completed


def test_one_claim_may_hold_both_and_admin_access_holds_neither(
        preparer: DevicePreparer) -> None:
    both = preparer.prepare(parse_claim(make_claim("one-tenant", [PF, VF])))
    assert both.completed  # one tenant
    preparer.unprepare(both.uid)
    preparer.prepare(parse_claim(make_claim("vf-holder", [VF])))
    monitor = preparer.prepare(parse_claim(admin("monitor", PF)))
    assert monitor.completed  # admin access sees the PF, and changes nothing
    # ... nor does it hold the PF against a VF: another tenant's VF 1 prepares beside it.
    assert preparer.prepare(parse_claim(make_claim("tenant", ["vf-0000-3b-00-3"]))).completed
