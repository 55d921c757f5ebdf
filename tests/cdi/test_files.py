"""Durable spec files and annotations, checked by the reference CDI library."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from cdi.annotations import ANNOTATION_PREFIX, annotations_for, parse_annotations
from cdi.atomicfile import OsFileOps
from cdi.errors import CDIError, CDINameError, CDISpecError, CDIWriteError
from cdi.files import claim_spec_file_name, read_spec, remove_spec, write_spec
from cdi.spec import CDIDevice, ContainerEdits, DeviceNode, Spec
from tests.cdi.conftest import Checker

UID = "8a6db5b8-7a93-4a7c-9f0e-0e6c3b2b8f11"
VENDOR = "k8s.dra-agent.io"


def claim_spec(uid: str = UID, env: str = "A=1") -> Spec:
    return Spec(
        f"{VENDOR}/claim",
        (
            CDIDevice(
                f"{uid}-gpu-0",
                ContainerEdits(
                    env=(env,),
                    device_nodes=(DeviceNode("/dev/null", type="c", major=1, minor=3),),
                ),
            ),
        ),
    )


def test_claim_file_name_follows_the_transient_convention() -> None:
    assert claim_spec_file_name(VENDOR, "claim", UID) == f"k8s.dra-agent.io-claim_{UID}.json"
    assert claim_spec_file_name(VENDOR, "claim", "a/b") == "k8s.dra-agent.io-claim_a_b.json"
    with pytest.raises(CDINameError):
        claim_spec_file_name("k8s.dra/agent", "claim", UID)
    with pytest.raises(CDISpecError):
        claim_spec_file_name(VENDOR, "claim", "")


def test_written_spec_is_valid_mode_0600_and_reads_back(checker: Checker, tmp_path: Path) -> None:
    cdi_dir = tmp_path / "run" / "cdi"  # created on demand, as on a fresh node
    name = claim_spec_file_name(VENDOR, "claim", UID)
    old_umask = os.umask(0)  # an inherited umask never widens it
    try:
        path = write_spec(cdi_dir, name, claim_spec())
    finally:
        os.umask(old_umask)
    assert path == cdi_dir / name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(cdi_dir) == [name]
    assert read_spec(path) == claim_spec()
    out = checker.validate(path)
    assert f"{VENDOR}/claim={UID}-gpu-0" in out
    assert "cdiVersion 0.5.0" in out  # the device name starts with a digit
    assert path.read_bytes() == (json.dumps(claim_spec().to_dict(), separators=(",", ":"))
                                 + "\n").encode()


def test_yaml_file_name_writes_yaml_the_library_reads(checker: Checker, tmp_path: Path) -> None:
    path = write_spec(tmp_path, "vendor.io-gpu.yaml", claim_spec())
    assert yaml.safe_load(path.read_text())["kind"] == f"{VENDOR}/claim"
    checker.validate(path)
    assert read_spec(path) == claim_spec()


def test_rewrite_replaces_the_file_atomically(checker: Checker, tmp_path: Path) -> None:
    name = claim_spec_file_name(VENDOR, "claim", UID)
    write_spec(tmp_path, name, claim_spec(env="A=1"))
    ino = (tmp_path / name).stat().st_ino
    write_spec(tmp_path, name, claim_spec(env="A=2"))
    assert (tmp_path / name).stat().st_ino != ino  # a new file renamed over the old one
    assert read_spec(tmp_path / name) == claim_spec(env="A=2")
    oci = checker.inject(tmp_path, f"{VENDOR}/claim={UID}-gpu-0")
    assert oci["process"]["env"] == ["A=2"]


class FailingOps(OsFileOps):
    """Real system calls except one, which fails with ``error`` (a full or read-only disk)."""

    def __init__(self, step: str, error: int) -> None:
        self.step, self.error = step, error

    def _maybe_fail(self, step: str) -> None:
        if step == self.step:
            raise OSError(self.error, os.strerror(self.error))

    def open(self, path: str, flags: int, mode: int = 0o777, *,
             dir_fd: int | None = None) -> int:
        if not flags & os.O_DIRECTORY:
            self._maybe_fail("open")
        return super().open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._maybe_fail("write")
        return super().write(fd, data[: max(1, len(data) // 3)])  # short writes are normal

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def replace(self, src: str, dst: str, *, src_dir_fd: int | None = None,
                dst_dir_fd: int | None = None) -> None:
        self._maybe_fail("replace")
        super().replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


@pytest.mark.parametrize("step", ["open", "write", "fsync", "replace"])
@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_failed_write_raises_with_path_and_cause_and_leaves_nothing_behind(
    tmp_path: Path, step: str, error: int
) -> None:
    name = claim_spec_file_name(VENDOR, "claim", UID)
    write_spec(tmp_path, name, claim_spec(env="A=old"))
    with pytest.raises(CDIWriteError) as info:
        write_spec(tmp_path, name, claim_spec(env="A=new"), ops=FailingOps(step, error))
    assert info.value.path == tmp_path / name
    assert info.value.cause.errno == error
    assert info.value.errno == error
    assert str(tmp_path / name) in str(info.value)
    assert os.listdir(tmp_path) == [name]  # no temp file
    assert read_spec(tmp_path / name) == claim_spec(env="A=old")  # old spec intact


def test_short_writes_still_write_everything(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "v.io-c.json", claim_spec(), ops=FailingOps("none", 0))
    assert read_spec(path) == claim_spec()


def test_unwritable_directory_is_a_write_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CDIWriteError, match="cannot write CDI spec"):
        write_spec(blocker / "cdi", "v.io-c.json", claim_spec())


def test_invalid_spec_or_file_name_is_refused_before_writing(tmp_path: Path) -> None:
    bad = Spec("vendor.io/gpu", (CDIDevice("gpu0", ContainerEdits()),))
    with pytest.raises(CDISpecError):
        write_spec(tmp_path, "v.io-c.json", bad)
    for name in ("spec.yml", "a/b.json", "spec.JSON", ""):
        with pytest.raises(CDISpecError):
            write_spec(tmp_path, name, claim_spec())
    assert os.listdir(tmp_path) == []


def test_remove_is_idempotent(tmp_path: Path) -> None:
    name = claim_spec_file_name(VENDOR, "claim", UID)
    write_spec(tmp_path, name, claim_spec())
    assert remove_spec(tmp_path, name) is True
    assert remove_spec(tmp_path, name) is False
    assert remove_spec(tmp_path / "missing-dir", name) is False
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"cdiVersion": "0.3.0"}', "kind"),
        ("[]", "must be an object"),
    ],
)
def test_read_spec_names_the_file_on_bad_content(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CDISpecError, match=message) as info:
        read_spec(path)
    assert info.value.path == path
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text("a: [")
    with pytest.raises(CDISpecError, match="not valid YAML"):
        read_spec(yaml_path)
    with pytest.raises(CDISpecError, match="cannot read"):
        read_spec(tmp_path / "missing.json")


# -- annotations -------------------------------------------------------------------------------


def test_annotations_round_trip_through_the_reference_parser(checker: Checker) -> None:
    names = [f"{VENDOR}/claim={UID}-gpu-0", f"{VENDOR}/claim={UID}-nic-0"]
    ann = annotations_for("dra-agent.io", UID, names)
    assert ann == {f"{ANNOTATION_PREFIX}dra-agent.io_{UID}": ",".join(names)}
    assert parse_annotations(ann) == (list(ann), sorted(names))
    out = checker.run("annotations", *(f"{k}={v}" for k, v in ann.items()))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"keys": list(ann), "devices": sorted(names)}


def test_long_plugin_names_still_get_a_valid_key_within_63_characters(checker: Checker) -> None:
    plugin = "a-very-long-driver-name.gpus.example.com"  # the kubelet 1.26-1.30 failed here
    ann = annotations_for(plugin, UID, [f"{VENDOR}/claim=x"])
    (key,) = ann
    suffix = key.removeprefix(ANNOTATION_PREFIX)
    assert len(suffix) <= 63
    assert suffix.endswith(UID) and suffix.startswith("a-very-long")
    assert annotations_for(plugin, UID, [f"{VENDOR}/claim=x"]) == ann  # deterministic
    assert annotations_for(plugin + "x", UID, [f"{VENDOR}/claim=x"]) != ann
    out = checker.run("annotations", f"{key}={VENDOR}/claim=x")
    assert out.returncode == 0, out.stderr
    huge = annotations_for("p", "x" * 100 + "/y", ["v.io/cc=x"])
    assert all(len(k) - len(ANNOTATION_PREFIX) <= 63 for k in huge)


def test_bad_annotations_are_refused_like_runtimes_do(checker: Checker) -> None:
    with pytest.raises(CDIError):
        annotations_for("", UID, ["v.io/cc=x"])
    with pytest.raises(CDIError):
        annotations_for("p", UID, [])
    with pytest.raises(CDINameError):
        annotations_for("p", UID, ["not-qualified"])
    bad = {f"{ANNOTATION_PREFIX}p_x": "v.io/cc=x,/dev/null", "other/key": "ignored"}
    with pytest.raises(CDINameError):
        parse_annotations(bad)
    out = checker.run("annotations", *(f"{k}={v}" for k, v in bad.items()))
    assert out.returncode == 1
    assert parse_annotations({"other/key": "x"}) == ([], [])
