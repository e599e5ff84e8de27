"""The newest entries of many capped lists (a tree's node records or events, one list per
context) in two round trips, whatever the number of contexts: the newest entry of every
list, then the ``count`` newest entries of only the lists that can hold one of the
``count`` newest of all (any of those is no older than its own list's newest)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from .topology import Client

SECONDS_BELOW = 10**11
"""A time below this is in seconds (year 5138), above it in ms (after 1973)."""


def entry_ms(entry_json: str) -> int:
    """When a node record or SafetyEvent happened, in ms since the epoch: its ``ts``
    (ms as the scripts write it, ISO 8601 as pydantic does), else its ``end_ts`` or
    ``start_ts`` (a node record's, in seconds); 0 when it has none or is not JSON."""
    try:
        entry = json.loads(entry_json)
    except ValueError:
        return 0
    if not isinstance(entry, dict):
        return 0
    for field in ("ts", "end_ts", "start_ts"):
        value = entry.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value * 1000 if value < SECONDS_BELOW else value)
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                           * 1000)
            except ValueError:
                continue
    return 0


def newest_entries(client: Client, lists: Sequence[tuple[str, str]], count: int
                   ) -> list[tuple[str, str]]:
    """(owner, entry) of the ``count`` newest entries across ``lists`` (owner, key),
    newest first (by ``entry_ms``; within one list, by position)."""
    if not lists or count <= 0:
        return []
    pipe = client.pipeline(transaction=False)
    for _, key in lists:
        pipe.lindex(key, -1)
    heads = pipe.execute()
    latest = sorted(((entry_ms(str(h)), i) for i, h in enumerate(heads) if h is not None),
                    reverse=True)[:count]
    if not latest:
        return []
    chosen = [lists[i] for _, i in latest]
    pipe = client.pipeline(transaction=False)
    for _, key in chosen:
        pipe.lrange(key, -count, -1)
    out = [(entry_ms(str(entry)), position, owner, str(entry))
           for (owner, _), entries in zip(chosen, pipe.execute(), strict=True)
           for position, entry in enumerate(entries)]
    out.sort(key=lambda e: (e[0], e[1]), reverse=True)
    return [(owner, entry) for _, _, owner, entry in out[:count]]
