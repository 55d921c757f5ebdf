"""The README's first `explain` walk-through, run as a newcomer would: its shell block verbatim
in an empty directory with the installed `dra-agent` on the PATH, then the edit it suggests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def _explain_block() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "dra-agent explain" in b and "claim.yaml" in b]
    return block


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("KUBECONFIG", None)
    return subprocess.run(["sh", "-ec", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_readme_claim_fits_on_the_simulated_node(tmp_path: Path) -> None:
    done = _run(_explain_block(), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "FITS" in done.stdout and "chosen: gpu-0, gpu-1" in done.stdout


def test_the_suggested_edit_does_not_fit_and_says_why(tmp_path: Path) -> None:
    block = _explain_block()
    assert "count: 2}" in block  # the README tells the reader to change exactly this
    done = _run(block.replace("count: 2}", "count: 9}"), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DOES NOT FIT" in done.stdout
    assert "needs 9 device(s) of class gpu.dra-agent.io but only 8 match" in done.stdout
