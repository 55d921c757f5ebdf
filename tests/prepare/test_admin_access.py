"""Admin access is for monitoring (#28, finding 3): a claim allocated with admin access may
see a device another claim holds, and it changes nothing on the host. What its config asks
that would (a moved interface, a GPU's interval or MPS limits, a VF's driver, a VF or MIG
instance made) is refused in one line naming admin access; the rest of it prepares.
Every effect's side of this is in test_effect_contract.py
(``test_an_admin_access_claim_changes_nothing_its_devices_holder_has``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.claim.parse import parse_claim
from agent.prepare.errors import AdminAccessError
from discovery.model import Inventory
from tests.plugnode import DRIVER, NODE, device_preparer, gpu, make_claim, nic

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig"}


def admin(device: str, **params: Any) -> dict[str, Any]:
    return make_claim("monitor", results=[
        {"request": "req", "driver": DRIVER, "pool": NODE, "device": device,
         "adminAccess": True}], config=[{"source": "FromClaim", "opaque": {
             "driver": DRIVER, "parameters": {**GOOD, **params}}}] if params else [])


@pytest.mark.parametrize(("device", "params", "names"), [
    ("nic-0", {"netdev": {"move": True}}, "netdev.move"),
    ("gpu-0", {"sharing": {"timeSlice": "Long"}}, "sharing"),
])
def test_config_that_changes_the_host_is_refused_for_admin_access(
        tmp_path: Path, device: str, params: dict[str, Any], names: str) -> None:
    preparer = device_preparer(tmp_path, lambda: Inventory(devices=(gpu(0), nic(0))))
    holder = preparer.prepare(parse_claim(make_claim("train", [device])))
    with pytest.raises(AdminAccessError) as err:
        preparer.prepare(parse_claim(admin(device, **params)))
    line = str(err.value)
    assert f"device {device} is allocated with admin access" in line and names in line
    assert "\n" not in line and err.value.reason == "admin_access"
    assert set(preparer.checkpoint.claims()) == {holder.uid}


def test_an_admin_access_claim_without_such_config_prepares_beside_the_holder(
        tmp_path: Path) -> None:
    preparer = device_preparer(tmp_path, lambda: Inventory(devices=(gpu(0), nic(0))))
    holder = preparer.prepare(parse_claim(make_claim("train", ["nic-0"])))
    record = preparer.prepare(parse_claim(admin("nic-0", env={"MONITOR": "1"})))
    assert record.completed and record.devices[0].admin_access
    preparer.unprepare(record.uid)
    assert set(preparer.checkpoint.claims()) == {holder.uid}
