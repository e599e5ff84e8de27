"""Path: where a context sits in its tree (the root id and the ids down to it)."""

from __future__ import annotations

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
