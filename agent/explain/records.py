"""``record``: the frozen dataclass of the explain model, cheap to build.

A ``@dataclass(frozen=True)`` sets each field in ``__init__`` through ``object.__setattr__``:
a 14-field Device took 21,000 instructions to build (a plain slots dataclass: 3,600), and one
explain builds 2,048 devices and 8,192 verdicts. So at run time a record is a slots dataclass
with the hash a frozen one has (``unsafe_hash``: the same fields hashed), and it is frozen for
the type checker (``dataclass_transform(frozen_default=True)``): mypy refuses an assignment to
a field as it does for a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    @dataclass_transform(frozen_default=True, field_specifiers=(field,))
    def record(cls: type[_T]) -> type[_T]:
        """A frozen dataclass to mypy."""
else:
    def record(cls: type[Any]) -> type[Any]:
        return dataclass(slots=True, unsafe_hash=True)(cls)
