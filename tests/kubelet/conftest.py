"""Short socket roots (AF_UNIX paths are limited to 108 bytes) and plugin/kubelet fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubelet import KubeletStandIn
from tests.kubelet.plugin import FakePlugin


@pytest.fixture
def root() -> Iterator[Path]:
    # tmp_path can exceed the socket path limit once plugins/<driver>/dra.sock is appended.
    path = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_plugin(root: Path) -> Iterator[Callable[..., FakePlugin]]:
    plugins: list[FakePlugin] = []

    def make(driver: str = "gpu.example.com", **kwargs: Any) -> FakePlugin:
        plugin = FakePlugin(root, driver, **kwargs)
        plugins.append(plugin)
        return plugin

    yield make
    for plugin in plugins:
        plugin.stop()


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(root / "plugins_registry", poll_interval=0.02, retry_initial=0.05) as k:
        yield k
