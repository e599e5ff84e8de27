"""Key names of context data, on the tree's hash tag like every other key of the tree
(built on :class:`coordinator.core.keys.KeySpace`)."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import KeySpace


@dataclass(frozen=True)
class DataKeys:
    """Context-data keys of one tenant's key space."""

    ks: KeySpace

    def data(self, root: str, ctx_id: str) -> str:
        """Hash: the context's own data, key -> JSON."""
        return f"{self.ks.prefix}:{{{root}}}:data:{ctx_id}"

    def meta(self, root: str, ctx_id: str) -> str:
        """Hash: the context's data record (isolation, step, size, exposure policy)."""
        return f"{self.ks.prefix}:{{{root}}}:dmeta:{ctx_id}"

    def view(self, root: str, ctx_id: str) -> str:
        """Hash: an isolated context's frozen view of its ancestors' data."""
        return f"{self.ks.prefix}:{{{root}}}:dview:{ctx_id}"

    def checkpoints(self, root: str) -> str:
        """Hash: the tree's checkpoints, id -> JSON."""
        return f"{self.ks.prefix}:{{{root}}}:checkpoints"

    def chain(self, root: str) -> str:
        """Stream: the tree's causal chain (step and capability events, capped)."""
        return f"{self.ks.prefix}:{{{root}}}:chain"

    def checkpoint_locator(self, checkpoint_id: str) -> str:
        """Cross-tree index: checkpoint id -> root id (a view, like the context locator)."""
        return f"{self.ks.prefix}:cpwhere:{checkpoint_id}"

    def context_keys(self, root: str, ctx_id: str) -> list[str]:
        """The keys that expire with a context."""
        return [self.data(root, ctx_id), self.meta(root, ctx_id), self.view(root, ctx_id)]

    def tree_keys(self, root: str) -> list[str]:
        """The tree-wide keys that expire with its root."""
        return [self.checkpoints(root), self.chain(root)]

    def levels(self, root: str, ids: tuple[str, ...]) -> list[str]:
        """data, meta, view of every level of a path, the context's own first, root last
        (the KEYS of data_read.lua and the ancestor part of data_spawn.lua)."""
        out: list[str] = []
        for cid in reversed(ids):
            out += [self.data(root, cid), self.meta(root, cid), self.view(root, cid)]
        return out
