"""Path: where a context sits in its tree (the root id and the ids down to it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Path:
    """Where a context sits: its tree (root id) and its ids from the root down to itself."""

    root: str
    ids: tuple[str, ...]

    @property
    def ctx_id(self) -> str:
        return self.ids[-1]

    @property
    def parent_id(self) -> str | None:
        return self.ids[-2] if len(self.ids) > 1 else None

    def child(self, ctx_id: str) -> Path:
        return Path(self.root, (*self.ids, ctx_id))


def stored_ids(h: Mapping[str, str], root: str, ctx_id: str) -> tuple[str, ...]:
    """The ids from ``root`` down to ``ctx_id`` as the context's hash ``h`` records
    them: ``mid``, the ids between the two (lua/open.lua: the whole path would pass
    Redis' 64-byte listpack limit from depth 1), or ``path``, the whole path, in a hash
    written by an earlier version."""
    if ctx_id == root:
        return (root,)
    if "mid" not in h and h.get("path"):
        return tuple(h["path"].split(","))
    mid = h.get("mid") or ""
    return (root, *(mid.split(",") if mid else ()), ctx_id)
