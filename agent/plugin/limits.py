"""Bounds on what the DRA gRPC server accepts, so no caller can exhaust its threads or memory.

The sync gRPC server runs every call, streams included, on one thread pool, and a
response-streaming call holds its thread for as long as the stream is open. So:

* response streams (the kubelet's ``NodeWatchResources``) get their own slots,
  ``MAX_STREAMS``, on top of the threads for prepare/unprepare; a stream beyond them is
  refused with RESOURCE_EXHAUSTED at once, and the pool is sized ``workers + MAX_STREAMS``,
  so open streams can never take a prepare/unprepare thread;
* ``maximum_concurrent_rpcs`` refuses calls beyond a short queue instead of queueing
  without end;
* ``grpc.max_receive_message_length`` refuses a request bigger than any pod could send
  before a handler reads it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

log = logging.getLogger(__name__)

#: The kubelet opens one health stream per plugin. One more lets its reconnect in before the
#: server has noticed the end of the old stream (a kubelet restart); more is a misbehaving
#: client, which the kubelet itself is not.
MAX_STREAMS = 2

#: Calls waiting for a thread. The kubelet sends one call per pod, and a node starting or
#: stopping many pods at once sends them together (110 pods by default, 250 is the usual
#: maximum): the queue lets such a burst wait instead of failing. A queued call costs only
#: what gRPC buffered of its request (at most the 64 KiB HTTP/2 window, see
#: ``server_options``), and one whose deadline passes while queued is answered without any
#: work (``PluginFramework`` checks the deadline before each claim).
QUEUED = 256

#: A claim reference is at most 63 (namespace) + 253 (name) + 36 (UID) bytes plus framing,
#: about 362 bytes; ``MAX_CLAIMS_PER_CALL`` (256) of the longest possible fits in 93 KiB.
#: 256 KiB leaves room for a few times that (the excess claims get their own errors) and
#: refuses whole the multi-megabyte requests no kubelet sends. With every running and queued
#: call at this size the running calls hold 16 * 256 KiB and the queued ones at most
#: 256 * 64 KiB: 20 MiB, far under the DaemonSet's 512 MiB limit.
MAX_RECEIVE_BYTES = 256 * 1024


def max_concurrent_rpcs(workers: int) -> int:
    """Running plus queued calls, streams included, before gRPC answers RESOURCE_EXHAUSTED."""
    return workers + QUEUED + MAX_STREAMS


def server_options() -> list[tuple[str, Any]]:
    # BDP probing widens each stream's HTTP/2 window until a client can push megabytes that
    # gRPC buffers before it refuses the oversized message: 400 calls of 3.6 MB took the agent
    # to 187 MiB with it, 47 MiB without (hack/benches/flood.py). Requests are a few KiB, so
    # the fixed 64 KiB window costs them nothing.
    return [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES), ("grpc.http2.bdp_probe", 0)]


class StreamSlots(grpc.ServerInterceptor):  # type: ignore[misc]
    """At most ``limit`` response streams open at once; the rest refused with one line.

    A slot is taken when the stream's handler starts on its thread and given back exactly
    once, when the handler ends or the RPC terminates, whichever comes first.
    """

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open = 0
        self.refused = 0

    @property
    def open(self) -> int:
        with self._lock:
            return self._open

    def intercept_service(
        self, continuation: Callable[[Any], Any], details: Any
    ) -> Any:
        handler = continuation(details)
        if handler is None or not handler.response_streaming or handler.request_streaming:
            return handler
        inner = handler.unary_stream
        method = str(details.method)

        def behaviour(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            release = self._take()
            if release is None:
                log.warning(
                    "stream refused: too many open",
                    extra={"method": method, "open": self.limit, "limit": self.limit},
                )
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.limit} streams of this plugin are open already; "
                    "the kubelet needs only one",
                )
            assert release is not None  # abort raised otherwise
            context.add_callback(release)
            try:
                yield from inner(request, context)
            finally:
                release()

        return grpc.unary_stream_rpc_method_handler(
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _take(self) -> Callable[[], None] | None:
        with self._lock:
            if self._open >= self.limit:
                self.refused += 1
                return None
            self._open += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self._open -= 1

        return release
