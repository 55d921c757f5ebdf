"""What the plugin layer asks of the rest of the agent, as upstream's ``kubeletplugin`` asks a
driver for its ``DRAPlugin``: a ``Preparer`` (``agent.prepare.DevicePreparer``), a
``ClaimSource`` (the API server: ``agent.plugin.apiclaims``) and a ``ClaimStatusReporter``
(``agent.claim.status``). The composition root (``agent.daemon.wiring``) hands them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import Claim, ClaimRef
from agent.claim.status import NicStatus
from agent.common.failpoints import Failpoints


class ClaimSource(Protocol):
    """Where claims come from (the API server, or a test's dict)."""

    def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        """The claim object; ClaimNotFoundError / ClaimFetchError when it cannot be had."""
        ...


class Preparer(Protocol):
    """What the framework hands each checked claim to, as upstream's helper hands a driver's
    ``DRAPlugin`` its claims (``agent.prepare.DevicePreparer``). It knows nothing of gRPC."""

    driver: str
    pool: str
    node_name: str
    failpoints: Failpoints | None

    def prepare(self, claim: Claim) -> ClaimRecord:
        """Prepare an allocated claim (UID checked); a ``ClaimError`` says why not."""
        ...

    def prepare_recorded(self, ref: ClaimRef) -> ClaimRecord | None:
        """Answer a repeated prepare from what is recorded; None when the claim is needed."""
        ...

    def unprepare(self, uid: str, ref: ClaimRef | None = None) -> None: ...

    def network_status(self, claim: Claim) -> list[NicStatus]: ...

    def recorded_claim(self, ref: ClaimRef, record: ClaimRecord) -> Claim | None: ...

    def recover(self) -> object:
        """Finish what a crash interrupted; before the first call is served."""
        ...

    def close(self) -> None:
        """Release what it holds open (the checkpoint); the last call."""
        ...


class ClaimStatusReporter(Protocol):
    """Reports prepared NICs in the claim (``ClaimStatusWriter``); must never raise."""

    def report(self, claim: Mapping[str, Any], nics: Sequence[NicStatus]) -> bool: ...
