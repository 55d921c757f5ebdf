"""Spec files: atomic write, idempotent remove, read back, claim file names.

Runtimes watch the CDI directory and read every ``*.json``/``*.yaml`` file in it, so a spec
is written by ``cdi.atomicfile.write_atomic``: under a temporary name that ends in neither,
renamed into place; a reader sees the old file or the complete new one. By default the file
and the directory are fsynced too, so after a power loss the rename is either durable or not
there at all; a caller that rebuilds its specs after a reboot anyway (the agent) says
``durable=False``. The file system calls go through ``FileOps`` so tests can make a disk fill
up or turn read-only at any step.

Spec files are mode 0600, root's only: ``SPEC_FILE_MODE`` says why (claim env values).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdi.atomicfile import OS_FILE_OPS, FileOps, fsync_dir, write_atomic
from cdi.errors import CDISpecError, CDIWriteError
from cdi.names import validate_class, validate_vendor
from cdi.parse import spec_from_dict
from cdi.spec import Spec

#: Claim specs are readable by root only. They carry the claim's environment (its opaque
#: config's ``env``: tokens, endpoints, whatever a user put there) and the claim's namespace,
#: name and UID, and the only readers on a Kubernetes node are containerd and CRI-O, which run
#: as root. The CDI library's own ``Cache.WriteSpec`` writes 0600 too (``os.CreateTemp`` in
#: pkg/cdi/spec.go, never chmodded); NVIDIA's DRA GPU plugin writes 0644 (nvcdi's default).
#: A rootless runtime (podman as a user) cannot read them, and has no claims to use them for.
SPEC_FILE_MODE = 0o600
SPEC_SUFFIXES = (".json", ".yaml")


def claim_spec_file_name(vendor: str, class_: str, claim_uid: str) -> str:
    """``<vendor>-<class>_<claimUID>.json``: the CDI library's name for a transient spec.

    A '/' in the transient id becomes '_' as the library does, so the name stays one file.
    """
    validate_vendor(vendor)
    validate_class(class_)
    if not claim_uid:
        raise CDISpecError("claim UID must not be empty")
    return f"{vendor}-{class_}_{claim_uid.replace('/', '_')}.json"


def _check_file_name(file_name: str) -> None:
    if "/" in file_name or file_name in ("", ".", ".."):
        raise CDISpecError(f"spec file name {file_name!r} must be a plain file name")
    if not file_name.endswith(SPEC_SUFFIXES):
        raise CDISpecError(
            f"spec file name {file_name!r} must end in .json or .yaml, or runtimes ignore it"
        )


def render_spec(spec: Spec, file_name: str) -> bytes:
    """The bytes of ``spec`` in the format its file name says (JSON or YAML)."""
    data = spec.to_dict()
    if file_name.endswith(".yaml"):
        import yaml  # only YAML writers pay for it

        text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
        return text.encode()
    # Compact, as the CDI library writes its own (json.Marshal): ``indent`` makes the json
    # module fall back to its pure-Python encoder (measured: 5% of the instructions of a
    # prepare and its unprepare).
    return (json.dumps(data, separators=(",", ":")) + "\n").encode()


def write_spec(
    cdi_dir: Path, file_name: str, spec: Spec, *, ops: FileOps | None = None,
    max_bytes: int | None = None, durable: bool = True,
) -> Path:
    """Validate ``spec`` and write it to ``cdi_dir/file_name`` (``SPEC_FILE_MODE``); with
    ``durable``, fsync the file and the directory (``cdi.atomicfile``).

    Raises ``CDIWriteError(path, cause)`` when the disk is full, read-only or not writable;
    no temporary file is left behind and an existing spec of that name is unchanged. With
    ``max_bytes``, a spec that renders longer is a ``CDISpecError`` (its reader caps it).
    The temporary name is random and opened ``O_EXCL|O_NOFOLLOW``: a symlink planted in the
    directory is never followed, and ``replace`` swaps the directory entry itself.
    """
    _check_file_name(file_name)
    spec.validate()
    data = render_spec(spec, file_name)
    if max_bytes is not None and len(data) > max_bytes:
        raise CDISpecError(f"it would be {len(data)} bytes, over the {max_bytes}-byte cap "
                           "it is read back with", cdi_dir / file_name)
    final = cdi_dir / file_name
    try:
        cdi_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomic(final, data, mode=SPEC_FILE_MODE, durable=durable,
                     ops=ops or OS_FILE_OPS)
    except OSError as err:
        raise CDIWriteError(final, err) from err
    return final


def remove_spec(cdi_dir: Path, file_name: str, *, ops: FileOps | None = None,
                durable: bool = True) -> bool:
    """Remove a spec; ``False`` when it was already gone. With ``durable`` the removal is
    fsynced (the directory)."""
    _check_file_name(file_name)
    path = cdi_dir / file_name
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise CDIWriteError(path, err) from err
    if not durable:
        return True
    try:
        fsync_dir(cdi_dir, ops or OS_FILE_OPS)
    except OSError as err:
        raise CDIWriteError(path, err) from err
    return True


def read_spec(path: Path) -> Spec:
    """Parse a spec file (JSON or YAML); ``CDISpecError`` names the file and the problem."""
    try:
        text = path.read_text()
    except OSError as err:
        raise CDISpecError(f"cannot read: {err.strerror or err}", path) from err
    data: Any
    if path.suffix == ".yaml":
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise CDISpecError(f"not valid YAML: {err}", path) from err
    else:
        try:
            data = json.loads(text)
        except ValueError as err:
            raise CDISpecError(f"not valid JSON: {err}", path) from err
    try:
        return spec_from_dict(data)
    except CDISpecError as err:
        raise CDISpecError(err.reason, path) from err
    except ValueError as err:
        raise CDISpecError(str(err), path) from err
