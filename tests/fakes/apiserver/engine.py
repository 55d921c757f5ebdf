"""Server state shared by the HTTP threads: store, registry, fault rules, request records."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import APIError, reason_for
from .registry import Registry, now_rfc3339
from .resources import ResourceType, default_resources
from .store import Store
from .watch import WatchSettings
from .writes import Writer

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One answered request. `verb` is the Kubernetes verb (get, list, watch, create, update,
    patch, delete, deletecollection; the HTTP method in lower case for non-resource paths)."""

    verb: str
    path: str
    status: int
    query: dict[str, str] = field(default_factory=dict)
    method: str = ""


@dataclass
class Rule:
    verb: str | None
    path_contains: str | None
    status: int = 500
    remaining: int = 0
    seconds: float = 0.0

    def matches(self, verb: str, method: str, path: str) -> bool:
        if self.verb is not None and self.verb.lower() not in (verb, method.lower()):
            return False
        return self.path_contains is None or self.path_contains in path


class Engine:
    """State shared by the HTTP threads; survives restarts when the state is kept."""

    def __init__(
        self,
        served: tuple[str, ...],
        log_size: int,
        gates: Mapping[str, bool] | None,
        settings: WatchSettings,
    ) -> None:
        self.resources: dict[str, ResourceType] = default_resources()
        self.served_versions = served
        self.watch_settings = settings
        self.gates = gates
        self.log_size = log_size
        self.lock = threading.Lock()
        self.requests: list[RequestRecord] = []
        self.failures: list[Rule] = []
        self.delays: list[Rule] = []
        self.open_watches = 0
        self._epoch = 0
        self._graceful = False
        self.stop_event = threading.Event()
        self.reset_state(0)

    def reset_state(self, start_rv: int) -> None:
        self.store = Store(self.log_size, start_rv)
        self.registry = Registry(
            self.store,
            self.resources,
            self.gates,
            too_large_wait=self.watch_settings.too_large_wait,
        )
        self.writer = Writer(self.registry)
        now = now_rfc3339(time.time)
        for ns in DEFAULT_NAMESPACES:
            self.store.commit(
                "namespaces",
                ("", ns),
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": ns,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": now,
                        "labels": {"kubernetes.io/metadata.name": ns},
                    },
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                },
            )
        if start_rv:
            self.store.forget_history()

    # WatchControl
    def watch_epoch(self) -> int:
        return self._epoch

    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def graceful_drop(self) -> bool:
        return self._graceful

    def drop_watches(self, graceful: bool) -> None:
        with self.store.cond:
            self._graceful = graceful
            self._epoch += 1
            self.store.cond.notify_all()

    def wake_watchers(self) -> None:
        with self.store.cond:
            self.store.cond.notify_all()

    def track_watch(self, delta: int) -> None:
        with self.lock:
            self.open_watches += delta

    def before_request(self, verb: str, method: str, path: str) -> None:
        with self.lock:
            delay = next((r.seconds for r in self.delays if r.matches(verb, method, path)), 0.0)
            rule = next(
                (r for r in self.failures if r.remaining > 0 and r.matches(verb, method, path)),
                None,
            )
            if rule is not None:
                rule.remaining -= 1
                self.failures = [r for r in self.failures if r.remaining > 0]
        if delay:
            self.stop_event.wait(delay)
        if rule is not None:
            # A real 429 carries Retry-After, and urllib3 then retries idempotent requests.
            headers = {"Retry-After": "1"} if rule.status == 429 else {}
            details = {"retryAfterSeconds": 1} if headers else None
            raise APIError(
                rule.status,
                f"injected failure ({reason_for(rule.status)})",
                details=details,
                headers=headers,
            )

    def record(self, verb: str, method: str, path: str, status: int, query: dict[str, str]) -> None:
        with self.lock:
            self.requests.append(RequestRecord(verb, path, status, dict(query), method))
