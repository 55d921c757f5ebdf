"""`FakeAPIServer`: the public face of the fake, its fault hooks and direct store access."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from agent.kube.transport import KubeHTTP, as_kubehttp

from .convert import from_version, to_version
from .engine import Engine, RequestRecord, Rule
from .errors import APIError
from .handler import APIServerHTTP
from .registry import now_rfc3339
from .resources import RESOURCE_VERSIONS, ResourceType
from .schema import decode, omit_empty
from .store import key_text
from .watch import WatchSettings


class FakeAPIServer:
    """An in-process kube-apiserver stand-in on 127.0.0.1 for resource.k8s.io, nodes, namespaces.

    `served_resource_versions` picks which resource.k8s.io versions exist (1.36 serves only v1
    by default). `bookmark_interval` is how often a watch that asked for bookmarks gets one.
    `feature_gates` overrides the 1.36 DRA gate defaults that decide which fields are dropped.
    `watch_timeout` is a watch's length when the client gives no timeoutSeconds, and
    `too_large_wait` how long a request for a future resourceVersion waits before its 504.
    """

    def __init__(
        self,
        served_resource_versions: tuple[str, ...] = ("v1",),
        event_log_size: int = 1000,
        *,
        port: int = 0,
        bookmark_interval: float = 1.0,
        watch_timeout: float = 1800.0,
        too_large_wait: float = 3.0,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self._check_versions(served_resource_versions)
        settings = WatchSettings(bookmark_interval, watch_timeout, too_large_wait)
        self._engine = Engine(
            tuple(served_resource_versions), event_log_size, feature_gates, settings
        )
        self._port = port
        self._httpd: APIServerHTTP | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def _check_versions(versions: tuple[str, ...]) -> None:
        unknown = [v for v in versions if v not in RESOURCE_VERSIONS]
        if unknown:
            raise ValueError(
                f"unknown resource.k8s.io versions {unknown}; known: {list(RESOURCE_VERSIONS)}"
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeAPIServer:
        if self._httpd is not None:
            return self
        self._engine.stop_event.clear()
        self._httpd = APIServerHTTP(("127.0.0.1", self._port), self._engine)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-apiserver-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._engine.stop_event.set()
        self._engine.wake_watchers()
        httpd.shutdown()
        httpd.cut_connections()
        httpd.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def restart(self, keep_state: bool = True) -> None:
        """Stop and start on the same port; every connection is cut. Without state, the new
        store continues the revision counter, but its history starts empty (old watches get 410)."""
        self.stop()
        if not keep_state:
            self._engine.reset_state(self._engine.store.rv)
        self.start()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- client plumbing -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def kube(self) -> KubeHTTP:
        """The agent's client for this server: a ``KubeHTTP`` over ``api_client()``, so that
        what a test hands to agent code goes through the official backend (OfficialBackend)."""
        return as_kubehttp(self.api_client())

    # -- fault hooks ---------------------------------------------------------------------------

    def fail_next(
        self,
        n: int,
        status: int = 500,
        *,
        verb: str | None = None,
        path_contains: str | None = None,
    ) -> None:
        """Answer the next `n` matching requests with `status` (a Status body). `verb` matches
        the Kubernetes verb or the HTTP method, case-insensitively."""
        with self._engine.lock:
            self._engine.failures.append(Rule(verb, path_contains, status, remaining=n))

    def delay(
        self, seconds: float, *, verb: str | None = None, path_contains: str | None = None
    ) -> None:
        """Hold matching requests for `seconds` before answering; `delay(0)` clears all delays."""
        with self._engine.lock:
            if seconds <= 0:
                self._engine.delays.clear()
            else:
                self._engine.delays.append(Rule(verb, path_contains, seconds=seconds))

    def drop_watches(self, *, graceful: bool = False) -> None:
        """Close every open watch: abruptly by default (connection cut), or as a normal end."""
        self._engine.drop_watches(graceful)

    def set_served_resource_versions(self, versions: tuple[str, ...]) -> None:
        self._check_versions(versions)
        self._engine.served_versions = tuple(versions)

    @property
    def open_watches(self) -> int:
        return self._engine.open_watches

    @property
    def requests(self) -> list[RequestRecord]:
        with self._engine.lock:
            return list(self._engine.requests)

    def clear_requests(self) -> None:
        with self._engine.lock:
            self._engine.requests.clear()

    # -- direct store access -------------------------------------------------------------------

    def _rtype(self, plural: str) -> ResourceType:
        try:
            return self._engine.resources[plural]
        except KeyError:
            raise ValueError(
                f"unknown resource {plural!r}; known: {sorted(self._engine.resources)}"
            ) from None

    def put_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` as the server would keep it (decoded against the schema, quantities in
        canonical form, defaults applied, uid, creationTimestamp, generation, a new revision),
        without validation and with `status` kept, so tests can seed allocated claims. A given
        uid is kept, a missing namespace is created, `generateName` works. Returns the stored
        (v1) object. Unknown fields or wrong types raise ValueError: a seed is test code."""
        kind = obj.get("kind")
        rtype = next((r for r in self._engine.resources.values() if r.kind == kind), None)
        if rtype is None:
            raise ValueError(f"cannot seed an object of kind {kind!r}")
        version = str(obj.get("apiVersion", "")).rsplit("/", 1)[-1] or "v1"
        try:
            decoded = decode(rtype, version, obj)
        except APIError as e:
            raise ValueError(f"cannot seed {kind}: {e.message}") from None
        if decoded.unknown:
            raise ValueError(f"cannot seed {kind}: unknown fields {decoded.unknown}")
        stored = from_version(rtype, decoded.obj, version)
        stored["apiVersion"] = rtype.api_version("v1")
        stored["kind"] = rtype.kind
        meta = stored.setdefault("metadata", {})
        meta.pop("resourceVersion", None)
        engine = self._engine
        store = engine.store
        with store.cond:
            ns = meta.get("namespace", "")
            if rtype.namespaced:
                if not ns:
                    raise ValueError("a namespaced object needs metadata.namespace")
                if store.get("namespaces", ("", ns)) is None:
                    self.put_object(
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                    )
            else:
                meta.pop("namespace", None)
                ns = ""
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ValueError("the object needs metadata.name or metadata.generateName")
                meta["name"] = engine.writer.generate_name(meta["generateName"])
            key = (ns, meta["name"])
            old = store.get(rtype.plural, key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp",
                old["metadata"]["creationTimestamp"] if old else now_rfc3339(time.time),
            )
            if rtype.spec_generation:
                gen = old["metadata"].get("generation", 1) if old else 1
                if old and old.get("spec") != stored.get("spec"):
                    gen += 1
                meta.setdefault("generation", gen)
            if rtype.plural == "namespaces":
                stored.setdefault("spec", {"finalizers": ["kubernetes"]})
                stored.setdefault("status", {"phase": "Active"})
            engine.writer.prepare(rtype, stored, old)
            omit_empty(rtype, stored)
            return store.commit(rtype.plural, key, stored)

    def get_object(
        self, kind_plural: str, name: str, namespace: str | None = None, version: str = "v1"
    ) -> dict[str, Any] | None:
        rtype = self._rtype(kind_plural)
        obj = self._engine.store.get(rtype.plural, (namespace or "", name))
        return self._out(rtype, obj, version) if obj is not None else None

    def list_objects(self, kind_plural: str, version: str = "v1") -> list[dict[str, Any]]:
        rtype = self._rtype(kind_plural)
        snap = self._engine.store.snapshot(rtype.plural)
        return [self._out(rtype, snap[k], version) for k in sorted(snap, key=key_text)]

    def delete_object(self, kind_plural: str, name: str, namespace: str | None = None) -> bool:
        """Remove an object directly (as garbage collection would); False if it was absent."""
        rtype = self._rtype(kind_plural)
        store = self._engine.store
        with store.cond:
            if store.get(rtype.plural, (namespace or "", name)) is None:
                return False
            store.commit(rtype.plural, (namespace or "", name), None)
            return True

    @staticmethod
    def _out(rtype: ResourceType, obj: dict[str, Any], version: str) -> dict[str, Any]:
        out = to_version(rtype, copy.deepcopy(obj), version)
        out["apiVersion"] = rtype.api_version(version)
        out["kind"] = rtype.kind
        return out

    @property
    def resource_version(self) -> int:
        """The current global revision."""
        return self._engine.store.rv
