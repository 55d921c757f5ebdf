"""The committed generated modules are exactly what hack/gen-protos.sh produces today."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

GEN = REPO / "hack" / "gen-protos.sh"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
PROTO_FILES = (
    "protos/pluginregistration/api.proto",
    "protos/dra/v1/api.proto",
    "protos/dra/v1beta1/api.proto",
    "protos/drahealth/v1/api.proto",
    "protos/drahealth/v1alpha1/api.proto",
)


def _generated(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / "protos").rglob("*"))
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(GEN), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert out.returncode == 0, out.stderr
    # Generated code embeds the grpcio-tools version; a different one differs in every file.
    tools = importlib.metadata.version("grpcio-tools")
    stamp = (REPO / "protos/dra/v1/api_pb2_grpc.py").read_text()
    assert f"GRPC_GENERATED_VERSION = '{tools}'" in stamp, (
        f"installed grpcio-tools {tools} is not the one that generated the committed modules; "
        "install that one or regenerate with hack/gen-protos.sh and commit"
    )
    fresh = _generated(tmp_path)
    committed = _generated(REPO)
    assert sorted(fresh) == sorted(committed), "generated file set differs; run hack/gen-protos.sh"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"committed modules differ from generation, run hack/gen-protos.sh: {stale}"


def test_every_proto_is_generated() -> None:
    protos = sorted(str(p.relative_to(REPO)) for p in (REPO / "protos").rglob("*.proto"))
    assert protos == sorted(PROTO_FILES)
    for proto in PROTO_FILES:
        stem = REPO / proto[: -len(".proto")]
        for suffix in GENERATED_SUFFIXES:
            assert Path(f"{stem}{suffix}").is_file(), f"{stem}{suffix} missing"


def test_every_generated_directory_is_a_package() -> None:
    for proto in PROTO_FILES:
        d = (REPO / proto).parent
        while d != REPO:
            assert (d / "__init__.py").is_file(), f"{d} is not a package"
            d = d.parent


def test_all_modules_import_together_in_a_fresh_process() -> None:
    # Five files are named api.proto; they must register under distinct descriptor-pool
    # names or the second import fails. A fresh interpreter sees the real import order.
    code = (
        "import importlib\n"
        "names = []\n"
        "for m in ('protos.pluginregistration', 'protos.dra.v1', 'protos.dra.v1beta1',\n"
        "          'protos.drahealth.v1', 'protos.drahealth.v1alpha1'):\n"
        "    pb = importlib.import_module(m + '.api_pb2')\n"
        "    importlib.import_module(m + '.api_pb2_grpc')\n"
        "    names.append(pb.DESCRIPTOR.name)\n"
        "print(' '.join(names))\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == list(PROTO_FILES)
