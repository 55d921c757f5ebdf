"""Simulated profiles generated once per session; tests that modify a tree build their own."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import scratch_dir, simulated_sources
from discovery.sources import Sources
from tests.conftest import REPO

OPENAPI_DIR = REPO / "tests" / "data" / "k8s-openapi"


@pytest.fixture(scope="session")
def scratch() -> Iterator[Path]:
    """A tmpfs work dir when available: profiles are thousands of small files."""
    with scratch_dir() as tmp:
        yield Path(tmp)


@pytest.fixture
def workdir(scratch: Path, request: pytest.FixtureRequest) -> Path:
    path = scratch / request.node.name
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def profile_sources(scratch: Path) -> Callable[[str], Sources]:
    cache: dict[str, Sources] = {}

    def get(profile: str) -> Sources:
        if profile not in cache:
            cache[profile] = simulated_sources(profile, scratch / f"session-{profile}")
        return cache[profile]

    return get


@pytest.fixture(scope="session")
def inventory_of(profile_sources: Callable[[str], Sources]) -> Callable[[str], Inventory]:
    cache: dict[str, Inventory] = {}

    def get(profile: str) -> Inventory:
        if profile not in cache:
            cache[profile] = discover(profile_sources(profile), DiscoveryOptions())
        return cache[profile]

    return get


def _strict(node: Any) -> Any:
    """Forbid unknown fields in every object definition, as the API server's strict decoding
    does, so a misspelt field fails the test instead of passing silently."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and out.get("type", "object") == "object":
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@pytest.fixture(scope="session", params=["1.35", "1.36", "1.37"])
def slice_validator(request: pytest.FixtureRequest) -> Any:
    """The v1 ResourceSlice schema of each supported minor (tests/data/README.md)."""
    import jsonschema

    path = OPENAPI_DIR / f"swagger-release-{request.param}.json"
    definitions = _strict(deepcopy(json.loads(path.read_text())["definitions"]))
    schema = {"$ref": "#/definitions/io.k8s.api.resource.v1.ResourceSlice",
              "definitions": definitions}
    return jsonschema.Draft4Validator(schema)


def write(path: Path, text: str) -> None:
    path.write_text(text + "\n")
