"""The reservation record: the JSON that reserve.lua keeps for each open reservation in
``bc:{R}:res``, decoded under readable names.

Its keys are short because every reservation writes one (lua/lib.lua, ``new_reservation``,
is the Lua side of this definition): ``c`` the context id that reserved, ``p`` the path
ids root first, ``d`` the held amounts as a flat list ``[dimension, amount, ...]``, ``k``
(present, 1) when the reservation id is a keyed call id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core.amounts import held_amount


@dataclass(frozen=True)
class ReservationRecord:
    """One open reservation, as reserve.lua recorded it."""

    ctx_id: str
    """The context that reserved (the last id of ``path``)."""
    path: tuple[str, ...]
    """Context ids from the root down to ``ctx_id``: the levels that hold the amounts."""
    held: tuple[Any, ...]
    """The held amounts, flat: dimension, amount, dimension, amount, ..."""
    keyed: bool
    """True when the reservation id is a keyed call id (its outcome is remembered)."""

    @classmethod
    def from_json(cls, text: str | bytes) -> ReservationRecord:
        raw = json.loads(text)
        return cls(ctx_id=str(raw["c"]), path=tuple(raw["p"]), held=tuple(raw["d"]),
                   keyed=bool(raw.get("k")))

    def held_pairs(self) -> Iterator[tuple[str, Any]]:
        """(dimension, amount) of every held amount."""
        held = self.held
        for i in range(0, len(held), 2):
            yield str(held[i]), held[i + 1]

    def held_amount(self, dim: str) -> int:
        """The amount held in ``dim`` (0 when none is)."""
        return held_amount(list(self.held), dim)
