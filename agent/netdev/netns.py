"""Network namespaces: entering one (setns(2)), and running a function inside one.

``setns(CLONE_NEWNET)`` changes the calling thread only, so the agent runs the function in a
thread of its own that ends with it (no thread of the agent's is ever left in a pod's
namespace); the hook, one thread and one job, enters for good. Python 3.11 has no
``os.setns``: libc's is called through ctypes, loaded only when a namespace is entered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

TYPE_CHECKING = False  # typing only for mypy: see agent.netdev.config
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` opens."""
    import ctypes  # only here: the hook's other paths never pay for it

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def run_in(netns_fd: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a new thread inside the namespace of ``netns_fd``; its result or error."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            setns(netns_fd)
            result.append(fn())
        except BaseException as err:  # handed to the caller's thread below
            failure.append(err)

    thread = threading.Thread(target=body, name="netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
