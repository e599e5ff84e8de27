"""The budget warnings a path's levels recorded (lib/warnings.lua: ``wa`` the thresholds
in parts per million, ``w:usd`` / ``w:steps`` how many of them each counter reached), read
back for a handle that registers ``on_warning`` or a listener that (re)subscribes: a
warning published while nobody listened is heard all the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..core.paths import Path
from ..models_records import BudgetWarning
from .tree import Store

_FIELDS = ("wa", "w:usd", "w:steps", "l:usd", "u:usd", "l:steps", "u:steps")
_DIMS: tuple[Literal["usd"], Literal["steps"]] = ("usd", "steps")


def read_warnings(store: Store, paths: Sequence[Path]) -> list[list[BudgetWarning]]:
    """For each path, the warnings its levels recorded, root first, each with what
    remains under the level's ceilings now (one round trip)."""
    pipe = store.client.pipeline(transaction=False)
    for path in paths:
        for cid in path.ids:
            pipe.hmget(store.ks.ctx(path.root, cid), *_FIELDS)
    results = iter(pipe.execute())
    out: list[list[BudgetWarning]] = []
    for path in paths:
        found: list[BudgetWarning] = []
        for cid in path.ids:
            found += _level_warnings(cid, next(results))
        out.append(found)
    return out


def _level_warnings(cid: str, values: Sequence[str | None]) -> list[BudgetWarning]:
    wa, w_usd, w_steps, l_usd, u_usd, l_steps, u_steps = values
    if not wa:
        return []
    try:
        thresholds = [int(p) / 1_000_000 for p in wa.split(",")]
        reached = {"usd": int(w_usd or 0), "steps": int(w_steps or 0)}
        left_usd = (max(0, int(l_usd) - int(u_usd or 0)) / 1_000_000
                    if l_usd is not None else None)
        left_steps = max(0, int(l_steps) - int(u_steps or 0)) if l_steps is not None else None
    except ValueError:  # not what the scripts write: no warning is read from it
        return []
    return [BudgetWarning(chain_id=cid, threshold=t, dimension=dim, remaining_usd=left_usd,
                          remaining_steps=left_steps)
            for dim in _DIMS for t in thresholds[:reached[dim]]]
