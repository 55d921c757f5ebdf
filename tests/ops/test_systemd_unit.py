"""systemd/dra-agent.service: systemd itself accepts it, and it says what the design says."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import click
import pytest

from agent.commands.options import common_options
from agent.common.config import Config
from agent.httpserver import parse_address
from tests.conftest import REPO

UNIT = REPO / "systemd" / "dra-agent.service"
ENV_EXAMPLE = REPO / "systemd" / "dra-agent.env"
INSTALLED = "/usr/local/bin/dra-agent"
#: The exposure score systemd-analyze gave the unit when it was written; a ratchet.
MAX_EXPOSURE = 2.0


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is missing: apt-get install systemd (.ci/run installs it)"
    return path


def _parse(text: str) -> dict[str, dict[str, list[str]]]:
    """Unit file -> section -> key -> values (keys repeat in unit files, so keep them all)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), defaultdict(list))
            continue
        assert current is not None, f"assignment outside a section: {line}"
        key, _, value = line.partition("=")
        current[key.strip()].append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return _parse(UNIT.read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unit with ExecStart pointing at this checkout's console script.

    verify checks that ExecStart's binary exists; the shipped path is where pip puts it on a
    host, so the copy points at the one installed in this virtual environment instead.
    """
    binary = Path(sys.executable).parent / "dra-agent"
    assert binary.exists(), f"{binary} missing: pip install -e . first"
    text = UNIT.read_text()
    assert text.count(INSTALLED) == 1
    out = tmp_path_factory.mktemp("unit") / "dra-agent.service"
    out.write_text(text.replace(INSTALLED, str(binary)))
    return out


def test_systemd_analyze_verify_passes(rendered: Path) -> None:
    out = subprocess.run(
        [_systemd_analyze(), "verify", str(rendered)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    # verify reports problems on stderr even when it exits 0: none are allowed.
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_verify_rejects_a_broken_unit(tmp_path: Path, rendered: Path) -> None:
    # Guards the test above against a verify that accepts anything.
    broken = tmp_path / "dra-agent.service"
    broken.write_text(rendered.read_text().replace("Type=notify", "Type=notifyy"))
    out = subprocess.run(
        [_systemd_analyze(), "verify", str(broken)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert "notifyy" in out.stderr


def test_security_exposure_stays_low(rendered: Path) -> None:
    out = subprocess.run(
        [_systemd_analyze(), "security", "--offline=yes", "--no-pager", str(rendered)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
    assert match, out.stdout + out.stderr
    score = float(match.group(1))
    print(f"systemd-analyze security exposure: {score}")
    assert score <= MAX_EXPOSURE, out.stdout


def test_notify_type_restart_and_watchdog(unit: dict[str, dict[str, list[str]]]) -> None:
    svc = unit["Service"]
    assert svc["Type"] == ["notify"]
    assert svc["NotifyAccess"] == ["main"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["WatchdogSec"] and svc["WatchdogSec"][0].endswith("s")
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_ordered_after_the_kubelet_without_binding_to_it(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    after = " ".join(unit["Unit"]["After"]).split()
    wants = " ".join(unit["Unit"]["Wants"]).split()
    assert "kubelet.service" in after and "kubelet.service" in wants
    # A kubelet restart must not stop the agent.
    assert not {"Requires", "BindsTo", "PartOf"} & set(unit["Unit"])


def test_runs_with_the_kubelets_kubeconfig(unit: dict[str, dict[str, list[str]]]) -> None:
    svc = unit["Service"]
    (exec_start,) = svc["ExecStart"]
    assert exec_start.split()[:2] == [INSTALLED, "run"]
    assert "--kubeconfig=${KUBELET_KUBECONFIG}" in exec_start.split()
    env = dict(item.split("=", 1) for value in svc["Environment"] for item in value.split())
    assert env["KUBELET_KUBECONFIG"] == "/etc/kubernetes/kubelet.conf"
    host, _ = parse_address(env["DRA_AGENT_METRICS_ADDRESS"])
    assert host == "127.0.0.1"  # loopback under systemd
    assert svc["EnvironmentFile"] == ["-/etc/default/dra-agent", "-/etc/dra-agent/env"]


def test_writable_paths_are_exactly_the_agents_state(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    svc = unit["Service"]
    cfg = Config()
    assert svc["ProtectSystem"] == ["strict"]
    writable = {p.lstrip("-") for value in svc["ReadWritePaths"] for p in value.split()}
    # Our plugin dir only, not /var/lib/kubelet/plugins: other drivers' sockets live there.
    assert writable == {str(cfg.plugin_dir), str(cfg.registry_dir)}
    made = [c.split()[-1] for c in svc["ExecStartPre"] if "mkdir" in c]
    assert str(cfg.plugin_dir) in made  # ReadWritePaths= needs it to exist
    # /var/run is a link to /run; RuntimeDirectory= makes /run/<name> writable.
    assert Path("/run", *svc["RuntimeDirectory"]) == Path("/run") / cfg.cdi_dir.relative_to(
        "/var/run"
    )
    assert svc["RuntimeDirectoryPreserve"] == ["yes"]  # specs of running containers stay
    assert svc["StateDirectory"] == ["dra-agent"]
    assert svc["ProtectHome"] == ["yes"]
    assert svc["PrivateTmp"] == ["yes"]


def test_privileges_are_minimal(unit: dict[str, dict[str, list[str]]]) -> None:
    svc = unit["Service"]
    assert svc["NoNewPrivileges"] == ["yes"]
    assert svc["CapabilityBoundingSet"] == [""]
    assert svc["AmbientCapabilities"] == [""]
    assert set(svc["RestrictAddressFamilies"][0].split()) == {
        "AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK",
    }
    assert svc["DevicePolicy"] == ["closed"]
    assert "ProcSubset" not in svc  # would hide /proc/driver/nvidia from NVML


def test_env_example_names_only_real_options() -> None:
    @click.command()
    @common_options
    def probe(**_: object) -> None: ...

    known = {str(p.envvar) for p in probe.params} | {"KUBELET_KUBECONFIG"}
    named = set(re.findall(r"^#?([A-Z_]+)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    assert named, "the example names no variables"
    assert named <= known, f"unknown variables in {ENV_EXAMPLE.name}: {named - known}"
    # Every line is a comment or KEY=VALUE: systemd's EnvironmentFile syntax, no shell.
    for line in ENV_EXAMPLE.read_text().splitlines():
        assert not line or line.startswith("#") or re.fullmatch(r"[A-Z_]+=\S*", line), line
