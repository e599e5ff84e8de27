"""The reservation record: the JSON that reserve.lua keeps for each open reservation in
``bc:{R}:res``, decoded under readable names.

Its keys are short because every reservation writes one (lua/lib/reservations.lua,
``new_reservation``, is the Lua side of this definition): ``c`` the context id that
reserved, ``p`` the path ids root first, ``d`` the held amounts as a flat list
``[dimension, amount, ...]``, ``k`` (present, 1) when the reservation id is a keyed call
id; a lease slice's also has ``s`` (1) and, when its unflushed part is given back at its
expiry, ``r`` (1). ``f`` keeps a settle or release a corrupt counter stopped
(lib/close_reservation.lua)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from ..core.amounts import held_amount
from ..models_records import NodeFields
from .state_check import canonical_int


@dataclass(frozen=True)
class PendingFinish:
    """A settle or release kept in a reservation record (its ``f``: outcome, node, amounts)
    because a corrupt counter on its path stopped it."""

    outcome: str
    """``ok`` (a settle), ``error`` or ``skip`` (a release)."""
    node_json: str
    """The node record it appends ('' for none)."""
    amounts: tuple[str, ...]
    """Flat dimension, amount pairs, as sent."""

    def node(self) -> NodeFields | None:
        """The node record, decoded."""
        return cast("NodeFields | None", json.loads(self.node_json) if self.node_json
                    else None)

    @classmethod
    def from_raw(cls, raw: Any) -> PendingFinish | None:
        if not isinstance(raw, list) or len(raw) != 3:
            return None
        amounts = raw[2] if isinstance(raw[2], list) else []  # cjson writes [] as {}
        if any(canonical_int(str(a)) is None for a in amounts[1::2]):
            return None  # not as it was sent: the reaper charges the estimate instead
        return cls(str(raw[0]), str(raw[1]), tuple(str(a) for a in amounts))


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
    pending: PendingFinish | None = None
    """The settle or release that a corrupt counter on the path stopped (``f``), kept to
    be charged as it was asked once the level is repaired."""
    returns_rest: bool = False
    """A lease slice (``r``) whose unflushed part is given back at its expiry instead of
    charged as used (``LeasePolicy.return_on_expiry``)."""

    @classmethod
    def from_json(cls, text: str | bytes) -> ReservationRecord:
        raw = json.loads(text)
        return cls(ctx_id=str(raw["c"]), path=tuple(raw["p"]), held=tuple(raw["d"]),
                   keyed=bool(raw.get("k")), returns_rest=raw.get("r") == 1,
                   pending=PendingFinish.from_raw(raw.get("f")))

    def held_pairs(self) -> Iterator[tuple[str, Any]]:
        """(dimension, amount) of every held amount."""
        held = self.held
        for i in range(0, len(held), 2):
            yield str(held[i]), held[i + 1]

    def held_amount(self, dim: str) -> int:
        """The amount held in ``dim`` (0 when none is)."""
        return held_amount(list(self.held), dim)
