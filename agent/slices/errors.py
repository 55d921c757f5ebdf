"""Errors the controller reports through ``on_error`` (it never raises them at the caller).

Each names the pool and slice and says what to do, because the operator reads them in a log
line far from the code that decided.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.slices.api import ApiError, Cause


class SliceError(Exception):
    """Base class: something about one pool (``pool``) could not be published."""

    def __init__(self, pool: str, message: str) -> None:
        super().__init__(message)
        self.pool = pool


class RejectedSliceError(SliceError):
    """The API server refused a slice as invalid (422); retried with a capped back-off."""

    def __init__(self, pool: str, index: int, slice_name: str, error: ApiError) -> None:
        fields = "; ".join(f"{c.field}: {c.message}" for c in error.causes) or error.message
        super().__init__(
            pool,
            f"pool {pool!r} slice #{index} ({slice_name}) rejected by the API server: {fields}; "
            "retried with back-off until the server accepts it or the driver corrects it",
        )
        self.index = index
        self.slice_name = slice_name
        self.causes: tuple[Cause, ...] = error.causes
        self.api_error = error


class DroppedFieldsError(SliceError):
    """The server stored a slice without some fields sent (a feature gate is off there)."""

    def __init__(
        self, pool: str, index: int, slice_name: str, fields: Sequence[str], gates: Sequence[str]
    ) -> None:
        gate_text = ", ".join(gates) if gates else "unknown"
        shown = ", ".join(fields[:5]) + (f" (+{len(fields) - 5} more)" if len(fields) > 5 else "")
        super().__init__(
            pool,
            f"pool {pool!r} slice #{index} ({slice_name}): the API server dropped {shown}; "
            f"probably disabled feature gate(s): {gate_text}. Published without them.",
        )
        self.index = index
        self.slice_name = slice_name
        self.fields = tuple(fields)
        self.gates = tuple(gates)


class PublishError(SliceError):
    """A write or read failed for a reason worth retrying (server down, conflict storm...)."""

    def __init__(self, pool: str, action: str, error: ApiError, retry_in_s: float) -> None:
        super().__init__(
            pool, f"pool {pool!r}: {action} failed: {error}; retrying in {retry_in_s:.1f}s"
        )
        self.action = action
        self.api_error = error
        self.retry_in_s = retry_in_s
