"""Spend by provider and model: each tree's hash (settle.lua and release.lua add a call's
micro-USD under ``<provider>|<model>``) rolled into the day's ``model`` spend view when
its root closes, what no field holds counted as ``unknown`` so that the rows sum to the
tree's spend."""

from __future__ import annotations

from ..core.keys import KeySpace, shard_of
from .state_check import canonical_int
from .topology import Client

MODEL = "model"
"""The spend view of closed trees by ``<provider>|<model>`` (``unknown``: calls that
named neither, and spend charged outside a call's settle)."""
UNKNOWN = "unknown"


def model_of(field: str) -> dict[str, str | None]:
    """``{"provider": ..., "model": ...}`` of a field of the ``model`` view (None: not
    named; both for ``unknown``)."""
    provider, _, model = field.partition("|") if field != UNKNOWN else ("-", "", "-")
    return {"provider": None if provider == "-" else provider,
            "model": None if model == "-" else model}


def model_rows(recorded: dict[str, int], spent: int) -> dict[str, int]:
    """A closed tree's spend by ``<provider>|<model>``, ``unknown`` taking the rest of
    ``spent``: the rows sum to ``spent`` (a field over it, from a settle landing after
    the close read the tree's spend, is cut to what is left)."""
    rows: dict[str, int] = {}
    left = spent
    for field, micro in sorted(recorded.items(), key=lambda kv: (-kv[1], kv[0])):
        take = min(max(micro, 0), left)
        if take:
            rows[field] = take
            left -= take
    if left:
        rows[UNKNOWN] = left
    return rows


def add_closed_models(client: Client, ks: KeySpace, root: str, spent: int, day: str,
                      retention_s: int) -> None:
    """Add a closed tree's spend by model to ``day``'s ``model`` view (shard of
    ``root``): two round trips, read then write."""
    raw = client.hgetall(ks.by_model(root))
    recorded = {str(k): canonical_int(str(v)) or 0 for k, v in raw.items()}
    key = ks.spend_by(MODEL, day, shard_of(root))
    pipe = client.pipeline(transaction=False)
    for field, micro in model_rows(recorded, spent).items():
        pipe.hincrby(key, field, micro)
    pipe.expire(key, retention_s)
    pipe.execute()
