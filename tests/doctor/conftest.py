"""A host root per test case, built in tmp_path: files, sockets, FIFOs, symlinks."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.doctor.context import Context, Options
from agent.doctor.host import HostRoot
from agent.doctor.model import Check, Status
from agent.kube.transport import Response


class Tree:
    """Writes host paths (``/etc/...``) under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def local(self, host_path: str) -> Path:
        path = self.root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, host_path: str, text: str | bytes) -> Tree:
        path = self.local(host_path)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return self

    def json(self, host_path: str, doc: Any) -> Tree:
        return self.write(host_path, json.dumps(doc))

    def dir(self, host_path: str) -> Tree:
        self.local(host_path).mkdir(exist_ok=True)
        return self

    def fifo(self, host_path: str) -> Tree:
        os.mkfifo(self.local(host_path))
        return self

    def symlink(self, host_path: str, target: str) -> Tree:
        os.symlink(target, self.local(host_path))
        return self

    def socket(self, host_path: str) -> Tree:
        path = self.local(host_path)
        short = self.root / ".s"
        with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
            sock.bind(str(short))
        os.replace(short, path)
        return self


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root = tmp_path / "host"
    root.mkdir()
    return Tree(root)


def context(tree: Tree, **kw: Any) -> Context:
    options = kw.pop("options", Options(node_name="n1"))
    return Context(host=HostRoot(tree.root), options=options, **kw)


def assert_check(check: Check, status: Status, *found: str, fix: str = "") -> None:
    """The status, text in ``found`` and (when not ok) a fix naming ``fix``."""
    assert check.status is status, check
    for text in found:
        assert text in check.found, (text, check)
    if status in (Status.WARN, Status.FAIL):
        assert check.fix and fix in check.fix, check
        assert "\n" not in check.found + check.fix
    else:
        assert check.fix == "", check


@dataclass
class FakeHttp:
    """Answers by (method, path): a (status, JSON body) pair, or an exception to raise."""

    answers: dict[tuple[str, str], Any] = field(default_factory=dict)
    reviews: Callable[[dict[str, Any]], bool] = lambda _attrs: True
    user: str = "system:serviceaccount:dra-agent:dra-agent"
    requests: list[tuple[str, str, Any]] = field(default_factory=list)

    @property
    def server(self) -> str:
        return "https://10.0.0.1:6443"

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None,
                content_type: str = "application/json", timeout: Any = None) -> Response:
        self.requests.append((method, path, query))
        if path.endswith("/selfsubjectaccessreviews"):
            allowed = self.reviews(body["spec"]["resourceAttributes"])
            return _resp(method, path, 201, {"status": {"allowed": allowed}})
        if path == "/version" and (method, path) not in self.answers:
            return _resp(method, path, 200, {"gitVersion": "v1.35.0"})
        if path.endswith("/selfsubjectreviews") and (method, path) not in self.answers:
            return _resp(method, path, 201, {"status": {"userInfo": {"username": self.user}}})
        answer = self.answers.get((method, path), (404, {"kind": "Status", "code": 404,
                                                          "reason": "NotFound",
                                                          "message": f"{path} not found"}))
        if isinstance(answer, BaseException):
            raise answer
        return _resp(method, path, *answer)


def _resp(method: str, path: str, status: int, doc: Any) -> Response:
    return Response(method, path, status, "", {}, json.dumps(doc).encode())
