"""agent.common.memory: glibc's arena cap and trim, and that ``dra-agent run`` caps the arenas
before its first thread starts (a thread keeps the arena it has)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.common.memory import Libc, limit_arenas, trim

REPO = Path(__file__).resolve().parents[2]
GLIBC = Libc.load().handle is not None and hasattr(Libc.load().handle, "malloc_trim")


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_trim_is_harmless_and_keeps_live_objects() -> None:
    live = [bytes(200_000) for _ in range(20)]  # above the mmap threshold and below it
    small = [str(i) * 10 for i in range(50_000)]
    del small
    assert trim() in (True, False)
    assert all(len(b) == 200_000 for b in live)
    assert trim() in (True, False)  # twice: nothing left to give back is fine


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_limit_arenas_is_accepted() -> None:
    assert limit_arenas() is True


def test_without_glibc_calls_nothing_happens() -> None:
    none = Libc(None)
    assert limit_arenas(none) is False
    assert trim(none) is None


def test_zero_arenas_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        limit_arenas(Libc(None), arenas=0)


def test_run_caps_arenas_before_any_thread_starts(tmp_path: Path) -> None:
    """The command's first act: the cap is recorded before any Thread.start, and the command
    goes on to its usual checks (here the one-line usage error, exit 2)."""
    script = textwrap.dedent("""
        import sys, threading
        import agent.common.memory as memory
        events = []
        real_limit, real_start = memory.limit_arenas, threading.Thread.start
        def limit(*a, **k):
            events.append(("limit", threading.active_count()))
            return real_limit(*a, **k)
        def start(self, *a, **k):
            events.append(("thread", self.name))
            return real_start(self, *a, **k)
        memory.limit_arenas = limit
        threading.Thread.start = start
        from agent.cli import main
        code = main(["run", "--rolling-update", "--node-name", "n"], standalone_mode=False)
        print(code, events)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)
    code, _, events = out.stdout.strip().partition(" ")
    assert code == "2", out.stderr
    assert events.startswith("[('limit', 1)"), events
    assert "--rolling-update needs --pod-uid" in out.stderr
