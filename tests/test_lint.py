"""ruff and mypy are part of the test command: a lint or type error fails the suite, and so
does a module grown past the size limit."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=False
    )


def test_ruff_clean() -> None:
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_clean() -> None:
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr


#: A module past about 400 lines is two concepts (issue 29): split it by concept, not by size.
MAX_MODULE_LINES = 420
SIZED = ("agent", "cdi", "discovery", "hack")
#: protoc's output, regenerated rather than written (hack/gen-protos.sh).
GENERATED = ("_pb2.py", "_pb2_grpc.py", ".pyi")
#: Folders .gitignore keeps out of the repository (built tools, virtual environments).
NOT_OURS = frozenset({".venv", "build", "dist", "bin", "__pycache__"})


def _size_exempt(source: str) -> bool:
    """A module whose docstring has a line starting ``size-exempt:`` (and says why)."""
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:  # ruff reports it; its size is still counted
        return False
    return any(line.strip().startswith("size-exempt:") for line in docstring.splitlines())


def test_no_module_is_over_the_size_limit() -> None:
    over = []
    for path in sorted(p for top in SIZED for p in (REPO / top).rglob("*.py")):
        if path.name.endswith(GENERATED) or NOT_OURS & set(path.relative_to(REPO).parts[:-1]):
            continue
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES and not _size_exempt(source):
            over.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not over, (f"{len(over)} modules over {MAX_MODULE_LINES} lines (split by concept, "
                      "or say 'size-exempt: why' in the docstring):\n" + "\n".join(over))
