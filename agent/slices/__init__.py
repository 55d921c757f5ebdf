"""The embedded ResourceSlice controller (the Python counterpart of the upstream
``k8s.io/dynamic-resource-allocation/resourceslice`` package).

    controller = start(http, "dra-agent.io", Owner(name=node), resources)
    controller.update(new_resources)   # non-blocking; the controller takes ownership
    controller.synced(5.0)             # True once the API server holds the desired state
    controller.stop()                  # returns when every thread has ended
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent.common.metrics import Metrics
from agent.kube.transport import KubeHTTP
from agent.slices.api import ApiError, KubeSliceClient, SliceClient
from agent.slices.chunk import chunk_devices
from agent.slices.controller import Controller
from agent.slices.errors import DroppedFieldsError, PublishError, RejectedSliceError, SliceError
from agent.slices.owner import Owner
from agent.slices.render import render_slices
from agent.slices.timing import Timing
from agent.slices.validate import PoolValidationError, Problem
from agent.slices.versions import NoResourceAPIError
from discovery.model import DriverResources


def start(
    api: KubeHTTP | SliceClient | None,
    driver: str,
    owner: Owner | None,
    resources: DriverResources | None,
    *,
    metrics: Metrics | None = None,
    resync_period_s: float = 600,
    stop_event: threading.Event | None = None,
    on_error: Callable[[Exception], None] | None = None,
    timing: Timing | None = None,
    list_attributes: bool | None = None,
    node_uid: str | None = None,
) -> Controller:
    """Start publishing ``resources`` for ``driver``; returns at once.

    ``api`` is the agent's ``KubeHTTP`` (or any ``SliceClient``, which tests pass); None gives
    an inactive controller that says so once (kubelet standalone mode). Errors found in the
    background go to ``on_error``; the controller retries what can succeed by retrying.
    ``list_attributes`` publishes list-valued attributes (numaNode) as lists (True) or as
    their scalar (False); None asks the server once, by a dry-run create (listattrs.py).
    ``node_uid``: a Node owner's UID as the caller has just read it (``OwnerUID`` says how
    far it is trusted); None: looked up.
    """
    client = KubeSliceClient(api) if isinstance(api, KubeHTTP) else api
    return Controller(
        client, driver, owner, resources, metrics=metrics, resync_period_s=resync_period_s,
        stop_event=stop_event, on_error=on_error, timing=timing,
        list_attributes=list_attributes, node_uid=node_uid,
    )


__all__ = [
    "ApiError",
    "Controller",
    "DroppedFieldsError",
    "NoResourceAPIError",
    "Owner",
    "PoolValidationError",
    "Problem",
    "PublishError",
    "RejectedSliceError",
    "SliceClient",
    "SliceError",
    "Timing",
    "chunk_devices",
    "render_slices",
    "start",
]
