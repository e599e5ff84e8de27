"""The rung of a model ladder a call served from a lease slice runs on (docs/degrade.md):
chosen in-process from what the slice has left and whether a level of the path was
below the ladder's threshold when the slice was taken (lease_take.lua's ``low``), in the
spirit of reserve.lua's choice for a strict reserve."""

from __future__ import annotations

from collections.abc import Sequence


def served_rung(rungs: Sequence[str | int], room: int, low: bool) -> int:
    """The rung of a ladder (``rungs``: model, worst case, ..., the requested model
    first) a slice with ``room`` micro-USD left serves, from 1; 0 for none. Not ``low``:
    the requested model if it fits (a cheaper one would degrade a call that a level may
    have room for: the strict reserve that follows chooses as reserve.lua does); ``low``
    (a level was below the ladder's threshold when the slice was taken): the cheapest
    that fits, of equal ones the last (lib/ladder.lua choose_rung)."""
    if not low:
        return 1 if int(rungs[1]) <= room else 0
    best, least = 0, room
    for i in range(1, len(rungs), 2):
        amount = int(rungs[i])
        if amount <= least:
            best, least = i // 2 + 1, amount
    return best
