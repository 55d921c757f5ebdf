"""``dra-agent explain``: the scheduler's structured-parameters allocator for one node, with the
reason for every device it did not pick. The CEL engine is imported only when ``explain()`` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.explain.api import explain
    from agent.explain.docs import InputError
    from agent.explain.result import ExplainResult

__all__ = ["ExplainResult", "InputError", "explain"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package must not load the allocator or the CEL engine.
    if name == "explain":
        from agent.explain.api import explain

        return explain
    if name == "ExplainResult":
        from agent.explain.result import ExplainResult

        return ExplainResult
    if name == "InputError":
        from agent.explain.docs import InputError

        return InputError
    raise AttributeError(name)
