"""The two hooks a context's life has into quotas: a root opens (it names the buckets of
the rules its labels match) and a root closes (its grants end, the rest returns)."""

from __future__ import annotations

from collections.abc import Callable

from ..core.paths import Path
from ..models import ChainMetadata
from ..runtime.coordinator import Coordinator
from .keeper import keeper_of


def quota_attachment(coord: Coordinator, path: Path, meta: ChainMetadata
                     ) -> tuple[list[str | int], Callable[[], None]]:
    """Before a context opens: the root hash fields naming the quota buckets a root's
    labels match (the open script writes them with the root, so no reserve sees it
    without them), and what to call once it is open. Reads the rules (cached) before the
    open, so that a failure leaves the open to be retried whole; a child draws through
    its root (no fields)."""
    if len(path.ids) != 1:
        return [], _nothing
    return keeper_of(coord).attachment(path, meta)


def _nothing() -> None:
    return None


def end_quota_grants(coord: Coordinator, path: Path) -> None:
    """A root closed: end its tree's grants (a no-op for a tree without quotas)."""
    keeper_of(coord).end_tree(path.root)
