"""Key names. Every key of one tree carries the root id as its hash tag, so a script can
touch the whole tree on one Redis Cluster slot. Scripts never build key names: the
client passes them all in KEYS."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

DASH_SORTS = ("spend", "fraction", "burn", "age")
"""The orders the dashboard keeps a sorted index of (``dash_index``; ``age``: newest first)."""

VIEW_SHARDS = 16
"""Cross-tree indexes are split in this many keys by hash of the root, so that no one key
(and no one cluster node) takes every root's open and close."""


def shard_of(root: str) -> int:
    """The cross-tree index shard of a root id."""
    return zlib.crc32(root.encode()) % VIEW_SHARDS


def validate_tenant(tenant: str) -> str:
    """Return ``tenant`` if it is usable in key names ('' is the default tenant)."""
    if tenant and not _TENANT.match(tenant):
        raise ValueError(f"tenant {tenant!r} must match {_TENANT.pattern}")
    return tenant


@dataclass(frozen=True)
class KeySpace:
    """Key names of one tenant. Different tenants never share a key or a channel."""

    tenant: str = ""

    @property
    def prefix(self) -> str:
        return f"bc:t:{self.tenant}" if self.tenant else "bc"

    @property
    def abort_channel(self) -> str:
        return f"{self.prefix}:abort"

    @property
    def ledger_channel(self) -> str:
        """Pub/sub channel of TokenLedgerUpdated events (all trees of the tenant)."""
        return f"{self.prefix}:ledger"

    def ledger(self, root: str) -> str:
        """Stream of a tree's TokenLedgerUpdated events."""
        return f"{self.prefix}:{{{root}}}:ledger"

    def ctx(self, root: str, ctx_id: str) -> str:
        return f"{self.prefix}:{{{root}}}:ctx:{ctx_id}"

    def kids(self, root: str, ctx_id: str) -> str:
        return f"{self.prefix}:{{{root}}}:kids:{ctx_id}"

    def nodes(self, root: str, ctx_id: str) -> str:
        return f"{self.prefix}:{{{root}}}:nodes:{ctx_id}"

    def events(self, root: str, ctx_id: str) -> str:
        return f"{self.prefix}:{{{root}}}:events:{ctx_id}"

    def reservations(self, root: str) -> str:
        return f"{self.prefix}:{{{root}}}:res"

    def done(self, root: str) -> str:
        """How keyed calls (replayable call ids) finished."""
        return f"{self.prefix}:{{{root}}}:done"

    def by_model(self, root: str) -> str:
        """Micro-USD settled in a tree by ``<provider>|<model>`` (settle.lua, release.lua;
        ``-`` for the part a call did not name): rolled into the day's ``model`` spend
        view when the root closes (store/model_spend.py)."""
        return f"{self.prefix}:{{{root}}}:bymodel"

    def finished(self, root: str) -> str:
        """Reservation ids that finished in the last hour (a repeated settle is a no-op)."""
        return f"{self.prefix}:{{{root}}}:fin"

    def leases(self, root: str) -> str:
        return f"{self.prefix}:{{{root}}}:leases"

    def slices(self, root: str) -> str:
        """The ids of a tree's open budget slices (lease mode; their count sizes slices)."""
        return f"{self.prefix}:{{{root}}}:slices"

    def lessees(self, root: str) -> str:
        """Who asked a tree for a budget slice lately (lease mode: slices shrink with
        their number; the key expires on its own)."""
        return f"{self.prefix}:{{{root}}}:lessees"

    def locator(self, ctx_id: str) -> str:
        """Cross-tree index: context id -> root id (a view, written outside the scripts)."""
        return f"{self.prefix}:where:{ctx_id}"

    def spend_by(self, label: str, day: str, shard: int) -> str:
        """Cross-tree view, one of VIEW_SHARDS: micro-USD of the trees closed on ``day``
        (UTC, YYYY-MM-DD) by ``org``, ``team`` or ``service`` (``total``: fields ``all``
        and ``unlabelled``), for the roots whose :func:`shard_of` is ``shard``."""
        return f"{self.prefix}:spend:{label}:{day}:{shard}"

    def roots_shard(self, root: str) -> str:
        """Cross-tree index, one of VIEW_SHARDS: root ids of trees not yet closed (by
        creation time) whose :func:`shard_of` is the one of ``root``."""
        return f"{self.prefix}:roots:{shard_of(root)}"

    def roots_shards(self) -> list[str]:
        return [f"{self.prefix}:roots:{i}" for i in range(VIEW_SHARDS)]

    # The dashboard's views: written by its indexer outside the scripts, rebuilt from the
    # tree hashes at any time (docs/dashboard.md).

    def dash_index(self, sort: str, scope: str) -> str:
        """Zset root -> score by ``sort`` (DASH_SORTS) within ``scope`` (``all`` or
        ``label=value``)."""
        return f"{self.prefix}:dash:idx:{sort}:{scope}"

    def dash(self, name: str) -> str:
        """One of the dashboard's per-tenant keys: ``rate`` (hash root -> USD per minute),
        ``samples`` (hash root -> burn samples JSON), ``indexed`` (hash root -> labels
        JSON), ``shield`` (set of breaker and window keys seen), ``leader`` (the indexer's
        lease), and the channels ``alerts`` and ``index`` (trees just indexed)."""
        return f"{self.prefix}:dash:{name}"

    def dash_open(self, name: str) -> str:
        """Hash value -> micro-USD (or count) of the open trees by ``name`` (org, team,
        service, provider, stops, held)."""
        return f"{self.prefix}:dash:open:{name}"

    def dash_closed_provider(self, day: str) -> str:
        """Hash provider -> micro-USD of the trees closed on ``day``."""
        return f"{self.prefix}:dash:closed:provider:{day}"

    def dash_series(self, root: str) -> str:
        """Zset of a tree's spend over time: member ``<minute>:<micro-USD>`` (the tree's
        spend when the indexer saw it in that minute) scored by the minute (Unix ms //
        60000); capped and expiring (store/dashboard_series.py)."""
        return f"{self.prefix}:dash:series:{root}"

    def dash_alerted(self, root: str, threshold: str) -> str:
        """An alert's dedup key (SET NX, expires)."""
        return f"{self.prefix}:dash:alerted:{root}:{threshold}"

    def path_keys(self, root: str, path: tuple[str, ...]) -> list[str]:
        """Context hash keys of a path, root first."""
        return [self.ctx(root, c) for c in path]
