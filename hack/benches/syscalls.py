"""The durable writes of a prepare and an unprepare, counted as system calls under strace.

What a durable write costs is its fsyncs (a flush of the disk's cache each, milliseconds on a
loaded disk, far more than the Python around them), and their number does not depend on the
machine's load. A child process runs the in-process case of ``hack.benches.instructions``
(a 1-GPU claim through the plugin's framework, device metadata off as in vs-upstream) under
``strace -f``, with a marker system call (``getppid``, which nothing else in it makes) between
the phases; the rows are the fsync-family calls (fsync, fdatasync, sync_file_range, syncfs)
and the renames in each phase, over its calls:

* prepare, unprepare: the CDI directory on the same disk as the plugin directory;
* the same with the CDI directory on tmpfs (``/dev/shm``, as ``/var/run/cdi`` on a node),
  when ``/dev/shm`` is one;
* 16 callers at once (one thread each, 16 claims, prepare then unprepare, 4 rounds): the
  fsyncs per claim prepared and unprepared, which group commit brings under the lone
  caller's.

The Go peer's counts are in docs/durability.md (its code, read): one fsync per prepare and
one per unprepare. Skipped with one line where strace cannot trace (no ptrace).

    python -m hack.benches.syscalls
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from hack.benches import Figure

CALLS = 20
PARALLEL, ROUNDS = 16, 4
ROOT = Path(__file__).resolve().parents[2]
_TRACED = "fsync,fdatasync,sync_file_range,syncfs,rename,renameat,renameat2,getppid"
_SYNC = re.compile(r"\b(fsync|fdatasync|sync_file_range|syncfs)\(")
_RENAME = re.compile(r"\b(rename|renameat|renameat2)\(")
_MARK = re.compile(r"\bgetppid\(")


def _child(case: str) -> None:
    import logging

    from hack.benches.instructions import prepare_node

    logging.disable(logging.CRITICAL)
    tmpfs = Path("/dev/shm") if case == "tmpfs" else None
    if case == "parallel":
        with prepare_node(False, claims=PARALLEL) as calls:
            for prepare, unprepare in calls:  # warm up
                prepare()
                unprepare()
            os.getppid()

            def caller(prepare: object, unprepare: object) -> None:
                for _ in range(ROUNDS):
                    prepare()  # type: ignore[operator]
                    unprepare()  # type: ignore[operator]

            threads = [threading.Thread(target=caller, args=c) for c in calls]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            os.getppid()
        return
    with prepare_node(False, cdi_parent=tmpfs) as calls:
        prepare, unprepare = calls[0]
        for _ in range(2):
            prepare()
            unprepare()
        for _ in range(CALLS):
            os.getppid()
            prepare()
            os.getppid()
            unprepare()
        os.getppid()


def _phases(trace: str) -> list[tuple[int, int]]:
    """(sync calls, renames) between consecutive markers."""
    out: list[tuple[int, int]] = []
    syncs = renames = 0
    started = False
    for line in trace.splitlines():
        if "resumed>" in line and "<..." in line:
            continue  # the second half of a call strace split across threads
        if _MARK.search(line):
            if started:
                out.append((syncs, renames))
            syncs = renames = 0
            started = True
        elif _SYNC.search(line):
            syncs += 1
        elif _RENAME.search(line):
            renames += 1
    return out


def count(case: str) -> list[tuple[int, int]]:
    out = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
        subprocess.run(["strace", "-f", "-qq", "-e", f"trace={_TRACED}", "-o",
                        str(out / "trace"), sys.executable, "-m", "hack.benches.syscalls",
                        "--child", case], check=True, capture_output=True, env=env, cwd=ROOT,
                       timeout=600)
        return _phases((out / "trace").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _tmpfs(path: str) -> bool:
    """``path`` is a tmpfs mount point (read from /proc/self/mounts: the bench also counts
    commits whose agent cannot tell)."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return False
    return any(f.split()[1:3] == [path, "tmpfs"] for f in mounts.splitlines())


def _works() -> bool:
    try:
        done = subprocess.run(["strace", "-qq", "-e", "trace=getppid", "true"],
                              capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def run(quick: bool) -> list[Figure]:  # quick: the same counts either way
    if not shutil.which("strace") or not _works():
        print("# syscalls: skipped, strace cannot trace here")
        return []
    figures: list[Figure] = []
    cases = ["disk"]
    if _tmpfs("/dev/shm"):
        cases.append("tmpfs")
    for case in cases:
        phases = count(case)
        where = "CDI dir on tmpfs" if case == "tmpfs" else "CDI dir on disk"
        prepares, unprepares = phases[0::2], phases[1::2]
        for op, items in (("prepare", prepares), ("unprepare", unprepares)):
            syncs = sum(s for s, _ in items) / len(items)
            renames = sum(r for _, r in items) / len(items)
            figures += [
                Figure(f"syscalls fsyncs per {op}, 1 GPU, {where}", syncs, "calls",
                       "<= 1 (Go peer: 1)", syncs <= 1),
                Figure(f"syscalls renames per {op}, 1 GPU, {where}", renames, "calls"),
            ]
    (syncs, _), = count("parallel")
    per_claim = syncs / (PARALLEL * ROUNDS)
    figures.append(Figure(f"syscalls fsyncs per prepare+unprepare, {PARALLEL} callers at once",
                          per_claim, "calls", "< 2 (Go peer: 2)", per_claim < 2))
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2])
    else:
        for figure in run(quick=False):
            print(figure.row())
