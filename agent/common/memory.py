"""The daemon's resident memory: glibc's allocator told what a long-running, mostly idle
agent wants (docs/memory.md has the figures).

``limit_arenas()`` caps glibc's malloc arenas. Each thread that mallocs while the others hold
the main arena's lock gets an arena of its own (up to 8 per CPU), and memory freed in one
arena never serves another: gRPC's completion-queue and poller threads, the HTTP workers
and the slices' watch each keep a heap that is mostly free. It must run before the first
thread starts: a thread bound to an arena keeps it.

``trim()`` hands the allocator's free pages back to the kernel (``malloc_trim(0)``): the
start-up's temporaries (parsed responses, the discovery's reads, the code of modules
compiled on the way) leave pages free inside the heap that glibc keeps mapped, since it only
gives back the top of the heap on its own.

Both are best-effort: on a libc without these calls (musl, macOS) they do nothing and say so
in their return value, never raise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

#: mallopt's parameter number for the arena cap (glibc's malloc.h).
M_ARENA_MAX = -8
#: Two arenas: the main one, and one that the threads share when the main one is busy.
ARENAS = 2


@dataclass(frozen=True)
class Libc:
    """glibc's allocator calls, where there are any."""

    handle: ctypes.CDLL | None

    @classmethod
    def load(cls) -> Libc:
        """This process's C library (already mapped: dlopen only finds it)."""
        try:
            handle = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            return cls(None)
        return cls(handle)

    def mallopt(self, param: int, value: int) -> bool:
        fn = getattr(self.handle, "mallopt", None) if self.handle is not None else None
        if fn is None:
            return False
        fn.argtypes = (ctypes.c_int, ctypes.c_int)
        fn.restype = ctypes.c_int
        return bool(fn(param, value))  # 1 on success

    def malloc_trim(self) -> bool | None:
        """True when memory was given back, False when there was none; None: no such call."""
        fn = getattr(self.handle, "malloc_trim", None) if self.handle is not None else None
        if fn is None:
            return None
        fn.argtypes = (ctypes.c_size_t,)
        fn.restype = ctypes.c_int
        return bool(fn(0))


def limit_arenas(libc: Libc | None = None, arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas``; whether the allocator took it. Call before
    any thread starts (a running thread keeps the arena it has)."""
    if arenas < 1:
        raise ValueError(f"arenas must be at least 1, not {arenas}")
    return (libc or Libc.load()).mallopt(M_ARENA_MAX, arenas)


def trim(libc: Libc | None = None) -> bool | None:
    """Give the allocator's free pages back to the kernel: True when some were, False when
    none were free, None where the C library has no such call."""
    return (libc or Libc.load()).malloc_trim()
