"""The documents a newcomer reads first stay true to the tree: the README stays short and keeps
the commands .ci/run runs as its own, ARCHITECTURE.md names every part that exists, and the
documents they point to are there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
DOCS = REPO / "docs"

#: The README's set-up commands, verbatim: a newcomer copies them, and .ci/run runs the second.
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/dra-agent discover",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest",
)
#: The real-Kubernetes suite as the README documents it and .ci/run runs it.
REALK8S = "hack/realk8s/test.sh 1.37 1.35"

#: Top-level folders that are no part of the code's layout (the docs themselves, build outputs).
NOT_LAYOUT = frozenset({"docs", "build", "dist"})


def _sh_lines(path: Path) -> set[str]:
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S)
    return {line.strip() for block in blocks for line in block.splitlines()}


def _packages() -> list[str]:
    """agent's packages (each folder with an ``__init__.py``), then the two beside it."""
    agent = sorted(f"agent/{p.parent.name}" for p in (REPO / "agent").glob("*/__init__.py"))
    return [*agent, "cdi", "discovery"]


def _top_level_folders() -> list[str]:
    return sorted(
        p.name for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and not p.name.endswith(".egg-info")
        and p.name not in NOT_LAYOUT
    )


def _parts_rows() -> list[str]:
    """The rows of ARCHITECTURE.md's table of parts ("| folder | holds |")."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## The parts"):]
    section = section[:section.index("\n## ", 1)]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_readme_is_under_300_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < 300, f"README.md has {lines} lines: detail belongs in docs/ or a folder's README"


def test_the_readme_keeps_its_setup_commands_verbatim() -> None:
    shown = _sh_lines(README)
    for command in (*SETUP, REALK8S):
        assert command in shown, f"README.md lost the command {command!r}"


def test_ci_runs_the_readmes_commands_as_written() -> None:
    script = (REPO / ".ci" / "run").read_text().splitlines()
    assert SETUP[1] in script, ".ci/run must run the README's test command verbatim"
    assert REALK8S in script, ".ci/run must run the README's real-Kubernetes suite command"


def test_architecture_exists_and_is_one_page() -> None:
    lines = len(ARCHITECTURE.read_text().splitlines())
    assert 0 < lines <= 200, f"ARCHITECTURE.md has {lines} lines: one page is the point"


def test_architecture_names_every_package_folder() -> None:
    rows = "\n".join(_parts_rows())
    missing = [p for p in _packages() if f"`{p}/`" not in rows]
    assert not missing, f"ARCHITECTURE.md's table of parts does not name {missing}"


def test_architecture_names_every_top_level_folder() -> None:
    rows = "\n".join(_parts_rows())
    missing = [p for p in _top_level_folders() if f"`{p}/`" not in rows]
    assert not missing, f"ARCHITECTURE.md's table of parts does not name {missing}"


def test_the_readme_links_architecture_and_the_benchmarks() -> None:
    text = README.read_text()
    assert "](ARCHITECTURE.md)" in text
    assert "](docs/benchmarks.md)" in text


def test_the_readme_links_the_threat_model() -> None:
    """#28: what the agent trusts is written down, and the README says where."""
    assert "](docs/security.md)" in README.read_text()
    text = (DOCS / "security.md").read_text()
    assert "integrity" in text and "authenticity" in text  # the checkpoint's unkeyed SHA-256


def test_every_document_named_exists() -> None:
    """Relative links, and `docs/*.md` named in backticks, from the README, ARCHITECTURE.md and
    docs/ resolve to files, so a moved or renamed page cannot leave a dangling pointer."""
    sources = [README, ARCHITECTURE, *sorted(DOCS.glob("*.md"))]
    dangling = []
    for source in sources:
        text = source.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            if not (source.parent / target.split("#", 1)[0]).exists():
                dangling.append(f"{source.relative_to(REPO)}: {target}")
        for named in re.findall(r"`(docs/[\w.-]+\.md)`", text):
            if not (REPO / named).is_file():
                dangling.append(f"{source.relative_to(REPO)}: {named}")
    assert not dangling, dangling
