"""Closing a tree while another Cluster primary is dead: the close's round trip writes
only the tree's own keys (on its primary). The cross-tree index writes (each context's
locator, the open-trees shard) are views kept outside the atomic scripts: they are sent
right after, and when their node does not answer they are queued for the flusher, which
sends them again until it does (they are idempotent)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..core.keys import KeySpace
from ..core.paths import Path
from .errors import RedisError
from .retention import tree_keys, walk
from .topology import Client
from .wire import Op, Wire, command

log = logging.getLogger(__name__)


def on_tree_node(ks: KeySpace, root: str) -> list[Op]:
    """An op placed on the tree's node, for a flush scoped to that node to go along."""
    return [command("EXISTS", ks.reservations(root))]


def send_or_queue(wire: Wire, ops: Sequence[Op]) -> None:
    """Send ``ops`` now; those a failure leaves unsent wait in the queue."""
    if not ops:
        return
    try:
        wire.round_trip(ops)
    except (OSError, RedisError) as exc:  # UNAVAILABLE, a script error or NotReplicated
        log.warning("index writes of a close queued (%s)", exc)
        for op in ops:
            wire.queue(op)


def index_writes(ks: KeySpace, path: Path, retention_s: int) -> list[Op]:
    """The close's writes to the cross-tree indexes."""
    ops = [command("EXPIRE", ks.locator(path.ctx_id), retention_s)]
    if len(path.ids) == 1:
        ops.append(command("ZREM", ks.roots_shard(path.root), path.root))
    return ops


def expire_closed_tree(client: Client, wire: Wire, ks: KeySpace, root: str,
                       retention_s: int) -> int:
    """Start the retention clock on every key of a closed tree (contexts never closed
    included): the tree's own keys in one pipeline, its contexts' locators sent or
    queued. Returns how many contexts."""
    contexts = walk(client, ks, root)
    locators = {ks.locator(cid) for cid in contexts}
    pipe = client.pipeline(transaction=False)
    for key in tree_keys(ks, root, contexts):
        if key not in locators:
            pipe.expire(key, retention_s)
    pipe.execute()
    send_or_queue(wire, [command("EXPIRE", key, retention_s) for key in sorted(locators)])
    return len(contexts)
