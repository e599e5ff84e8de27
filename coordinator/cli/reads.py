"""What budgetctl reads from Redis: an id (or a unique prefix) resolved to its tree, a
tree level by level, the open trees; all through the cross-tree views."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.paths import stored_ids
from ..errors import BudgetCoordinatorError, ContextNotFoundError
from ..runtime.coordinator import Coordinator
from .rows import Node, Row, Stop, own_stop, row

MAX_KIDS_SHOWN = 50
"""Children shown under one context (the rest are counted)."""
MAX_NODES = 2000
"""Contexts one tree view reads at most."""
MAX_SORTED = 10_000
"""Open trees `top` reads to sort by spend or fraction (about the newest ones)."""


class AmbiguousIdError(BudgetCoordinatorError, LookupError):
    """An id prefix names more than one open tree."""

    def __init__(self, prefix: str, matches: list[str]) -> None:
        self.prefix = prefix
        self.matches = matches
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        super().__init__(f"{prefix!r} is the start of several open trees' ids ({shown}); "
                         f"give more of the id")


class UnknownIdError(ContextNotFoundError):
    """No context has this id, and no open tree's root id starts with it."""

    def __init__(self, ref: str) -> None:
        super().__init__(ref)
        self.args = (f"no context {ref!r} in this Redis, and no open tree's id starts with "
                     f"it (a closed tree, or a context below a root, needs its full id: "
                     f"`budgetctl tree` prints them)",)


@dataclass(frozen=True)
class Located:
    """A context found by id: its tree's root id and its path from the root."""

    root: str
    ids: tuple[str, ...]

    @property
    def ctx_id(self) -> str:
        return self.ids[-1]


def locate(coord: Coordinator, ref: str) -> Located:
    """The context whose id is ``ref``, or the open tree whose root id starts with
    ``ref``. Raises UnknownIdError, or AmbiguousIdError for a prefix of several."""
    ctx_id = ref
    root = coord.views.locate(ref) if ref else None
    if root is None and ref:
        matches = coord.views.roots_with_prefix(ref, limit=6)
        if len(matches) > 1:
            raise AmbiguousIdError(ref, matches)
        if matches:
            root = ctx_id = matches[0]
    if root is None:
        raise UnknownIdError(ref)
    h = coord.views.read_contexts([(root, ctx_id)])[0]
    if not h:
        raise ContextNotFoundError(ctx_id)
    return Located(root, stored_ids(h, root, ctx_id))


def _stop_above(coord: Coordinator, where: Located, now_ms: int) -> Stop | None:
    """The nearest stop among the ancestors of a context (nearest wins)."""
    ancestors = where.ids[:-1]
    hashes = coord.views.read_contexts([(where.root, a) for a in ancestors])
    stop = None
    for cid, h in zip(ancestors, hashes, strict=True):
        stop = own_stop(cid, h, now_ms) or stop
    return stop


def read_tree(coord: Coordinator, where: Located, max_kids: int = MAX_KIDS_SHOWN,
              max_nodes: int = MAX_NODES) -> tuple[Node, int]:
    """The subtree under a context, read one level per round trip, each context carrying
    its own stop or the nearest stopped ancestor's; and the Redis time it was read at."""
    now = coord.views.now_ms()
    top_stop = _stop_above(coord, where, now)
    level: list[tuple[str, Stop | None, Node | None]] = [(where.ctx_id, top_stop, None)]
    root_node: Node | None = None
    read = 0
    while level:
        ids = [cid for cid, _, _ in level]
        hashes, kids = coord.views.read_level(where.root, ids)
        read += len(ids)
        nxt: list[tuple[str, Stop | None, Node | None]] = []
        for (cid, above, parent), h, children in zip(level, hashes, kids, strict=True):
            node = Node(row(cid, h, above, now))
            if parent is None:
                root_node = node
            else:
                parent.children.append(node)
            room = max(0, min(max_kids, max_nodes - read - len(nxt)))
            node.more = max(0, len(children) - room)
            nxt += [(k, node.row.stop or above, node) for k in children[:room]]
        level = nxt
    assert root_node is not None
    return root_node, now


@dataclass(frozen=True)
class Top:
    """The open trees shown, how many are open, and the Redis time they were read at."""

    rows: list[Row]
    total: int
    now_ms: int
    sorted_among: int
    """How many (newest) open trees the sort looked at."""
    burn: dict[str, float]
    """USD per minute over the last minute, by root, as the dashboard's indexer rated
    them (empty when no dashboard or ``budgetctl alerts`` runs)."""


def read_top(coord: Coordinator, sort: str, limit: int) -> Top:
    """The ``limit`` open trees that come first by ``sort``, largest or newest first."""
    now = coord.views.now_ms()
    trees, total, examined = coord.views.open_trees(limit, sort=sort, scan=MAX_SORTED)
    return Top([row(t.root, t.fields, None, now) for t in trees], total, now, examined,
               coord.views.burn_rates([t.root for t in trees]))
