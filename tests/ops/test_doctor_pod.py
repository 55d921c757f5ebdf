"""deploy/doctor/pod.yaml: the one-shot doctor pod reads the host's / read-only, as the agent's
own ServiceAccount, with the DaemonSet's image, and its arguments are ones `doctor` takes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO

POD = REPO / "deploy" / "doctor" / "pod.yaml"


def _pod() -> dict[str, Any]:
    (pod,) = list(yaml.safe_load_all(POD.read_text()))
    assert isinstance(pod, dict)
    return pod


def _daemonset() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    (ds,) = [d for d in docs if d and d["kind"] == "DaemonSet"]
    assert isinstance(ds, dict)
    return ds


def test_it_reads_the_hosts_root_and_writes_nothing() -> None:
    spec = _pod()["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts.keys() == volumes.keys()
    assert volumes["host"]["hostPath"]["path"] == "/"
    assert mounts["host"] == {"name": "host", "mountPath": "/host", "readOnly": True,
                              "recursiveReadOnly": "IfPossible"}
    assert "--host-root=/host" in container["args"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert "privileged" not in security and security["capabilities"]["drop"] == ["ALL"]
    assert spec["restartPolicy"] == "Never"


def test_it_is_the_agents_identity_image_and_namespace() -> None:
    pod, ds = _pod(), _daemonset()
    template = ds["spec"]["template"]["spec"]
    assert pod["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert pod["spec"]["serviceAccountName"] == template["serviceAccountName"]
    (agent,) = template["containers"]
    (doctor,) = pod["spec"]["containers"]
    assert doctor["image"] == agent["image"]
    assert pod["spec"]["hostNetwork"] is True  # the agent's metrics port on the node's IP
    assert pod["spec"]["nodeName"] == "NODE_NAME_HERE"  # the README's sed replaces it


def test_doctor_takes_its_arguments(tmp_path: Any) -> None:
    (container,) = _pod()["spec"]["containers"]
    args = [a.replace("$(HOST_IP)", "127.0.0.1") for a in container["args"]]
    assert args[0] == "doctor"
    host = tmp_path / "host"
    host.mkdir()
    out = CliRunner().invoke(main, [*[a.replace("/host", str(host)) for a in args],
                                    "--kubeconfig", "none", "-o", "json"])
    assert out.exit_code in (0, 1), out.output  # a verdict on an empty root, not bad input
    checks = {c["name"]: c for c in json.loads(out.output)["checks"]}
    # It looked where the pod mounts the host: an empty one finds no container runtime there.
    assert str(host) in checks["container runtime"]["found"]


#: The doctor's mounts that may be written, each with why: none. It reads the host and answers
#: on stdout; the one temporary file the code base ever makes (a kubeconfig's embedded client
#: key, agent/kube/lean.py) never comes up with the pod's ServiceAccount credentials.
WRITABLE: dict[str, str] = {}


def test_it_adds_no_capability() -> None:
    # uid 0 reads root's own files by their owner bits; DAC_READ_SEARCH would add only files
    # of other owners, which none of the doctor's are on a node.
    (container,) = _pod()["spec"]["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsUser"] == 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_nothing_it_mounts_is_writable() -> None:
    spec = _pod()["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        if mount["name"] in WRITABLE:
            continue
        assert mount.get("readOnly") is True, mount
        if "hostPath" in volumes[mount["name"]]:
            # The host's submounts too (/run, /var/lib/kubelet/pods, ...), where the runtime
            # can: a plain read-only bind leaves them writable by their owner, root.
            assert mount.get("recursiveReadOnly") == "IfPossible", mount
            assert "mountPropagation" not in mount
    assert set(WRITABLE) <= set(volumes)


#: mount_setattr(2) with MOUNT_ATTR_RDONLY and AT_RECURSIVE on argv[1]: what the runtime does
#: for ``recursiveReadOnly`` (442 on every architecture since Linux 5.12).
_RECURSIVE_RO = """\
import ctypes, os, struct, sys
attr = ctypes.create_string_buffer(struct.pack("QQQQ", 1, 0, 0, 0))
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(442, -100, sys.argv[1].encode(), 0x8000, attr, 32) != 0:
    sys.exit(f"mount_setattr: {os.strerror(ctypes.get_errno())}")
"""


def _as_the_pod(view: Path, host: Path) -> subprocess.CompletedProcess[str]:
    """``dra-agent doctor --host-root host`` as the pod runs it: uid 0 without a capability
    (bounding set empty, so none after exec), no new privileges, every file system read-only
    (the whole machine bound recursively read-only at ``view``, then chroot'ed into)."""
    python = sys.executable
    inner = (f"grep CapEff /proc/self/status >&2; cd {REPO} && exec {python} -m agent.cli "
             f"doctor --host-root {host} --kubeconfig none --metrics-address none -o json")
    script = (f'mount --rbind / "$1" && {python} -c "$2" "$1" && exec chroot "$1" setpriv '
              "--reuid=0 --regid=0 --clear-groups --inh-caps=-all --bounding-set=-all "
              f'--no-new-privs sh -c "$3"')
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           "sh", str(view), _RECURSIVE_RO, inner],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _owner_only(root: Path) -> None:
    """Every file and directory under ``root`` root's own, and no one else's to read."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        os.chown(path, 0, 0)
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def _checks(out: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert out.returncode in (0, 1), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return {c["name"]: c for c in json.loads(out.stdout)["checks"]}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                    or not shutil.which("setpriv"),
                    reason="needs root (to become uid 0 without capabilities), unshare and "
                           "setpriv")
def test_without_capabilities_it_reads_what_its_checks_need(tmp_path: Path) -> None:
    """The pod's reader against a healthy node whose files are root's own, mode 0600 and
    0700: every check says what it says with every privilege. A file of another owner is the
    one thing DAC_READ_SEARCH would add, and it is one line naming it."""
    from agent.checkpoint.codec import encode
    from agent.checkpoint.model import CheckpointData
    from agent.doctor.context import Options
    from agent.doctor.simulate import healthy_host_root

    host, view = tmp_path / "host", tmp_path / "view"
    view.mkdir()
    options = Options()
    healthy_host_root("sriov-nic", host, options)
    # The agent's own checkpoint, as the agent writes it (mode 0600 below).
    (host / str(options.plugin_dir).lstrip("/") / "checkpoint.json").write_bytes(
        encode(CheckpointData()))
    _owner_only(host)
    probe = _as_the_pod(view, host)
    if "mount_setattr" in probe.stderr or "unshare:" in probe.stderr:
        pytest.skip(f"no private read-only mount namespace here: {probe.stderr.strip()}")
    assert "CapEff:\t0000000000000000" in probe.stderr, probe.stderr
    privileged = subprocess.run(
        [sys.executable, "-m", "agent.cli", "doctor", "--host-root", str(host),
         "--kubeconfig", "none", "--metrics-address", "none", "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert _checks(probe) == _checks(privileged)
    read = _checks(probe)
    assert read["kubelet feature gates"]["status"] == "ok"  # it read config.yaml
    assert read["agent checkpoint"]["found"].endswith("checkpoint.json: 0 claim record(s)")
    assert read["runtime CDI"]["status"] == "ok"  # containerd's config, and its drop-in
    checkpoint = host / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    os.chown(checkpoint, 12345, 12345)
    found = _checks(_as_the_pod(view, host))["device plugins"]
    assert found["status"] == "warn", found
    assert found["found"] == ("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint: "
                              "Permission denied"), found
