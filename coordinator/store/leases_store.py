"""Budget slices in Redis (lease mode): take a slice, flush a batch of what its calls
spent (returning the rest with the last one), reclaim a dead process's slice (its
unflushed part charged as used, or given back on opt-in); each reply
decoded once into a typed result."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.contracts import LEASE_FLUSH, LEASE_RETURN, LEASE_TAKE
from ..core.paths import Path
from ..core.script_constants import NODE_STREAM_CAP
from ..core.vocabulary import FinishCode, NodeStatus, TakeCode
from ..models_records import NodeFields, encode_node
from .records import ReservationRecord
from .tree import Stop, Store, decode_stops
from .wire import Op

SLICE_PREFIX = "slice:"
"""Slice ids start with it: a reaper tells a slice from a call's reservation by it."""
SHARE_DIVISOR = 4
"""A slice takes at most what remains / (SHARE_DIVISOR * lessees) of a limited dimension,
so that near a ceiling every process asking gets a share."""


def is_slice(reservation_id: str) -> bool:
    return reservation_id.startswith(SLICE_PREFIX)


@dataclass(frozen=True)
class Taken:
    """A slice held at every level: its amounts by dimension."""

    amounts: dict[str, int]
    now_ms: int
    expired: list[tuple[str, ReservationRecord]]
    """Reservations (and slices) of this tree whose lease expired."""
    low: bool = False
    """Some level had less than the ladder's threshold of its USD ceiling left."""


@dataclass(frozen=True)
class NotTaken:
    """No slice: the caller takes strict reserves (which report any stop)."""

    reason: str
    now_ms: int


@dataclass
class Batch:
    """What calls served from a slice spent since the last flush."""

    seq: int
    nodes: list[str]
    events: list[str]
    spent: dict[str, int]
    """Amounts by dimension; ``steps`` counts completed calls, ``retries`` failed ones."""


def decode_take(reply: list[Any]) -> Taken | NotTaken:
    """lease_take.lua's reply (see its contract)."""
    if int(reply[0]) != TakeCode.TAKEN:
        return NotTaken(str(reply[2]), int(reply[1]))
    n = int(reply[3])
    amounts = {str(reply[4 + 2 * i]): int(reply[5 + 2 * i]) for i in range(n)}
    rest = 4 + 2 * n
    expired = [(str(reply[i]), ReservationRecord.from_json(reply[i + 1]))
               for i in range(rest, len(reply), 2)]
    return Taken(amounts, int(reply[1]), expired, int(reply[2]) == 1)


class LeaseStore:
    """The slice scripts, run on a tree store's wire and key space."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.wire = store.wire
        self.ks = store.ks

    def _keys(self, path: Path) -> list[str]:
        # lease_flush.lua and lease_return.lua take the same KEYS (tests/unit/test_contracts.py)
        ks, root = self.ks, path.root
        return LEASE_FLUSH.key_list(
            res=ks.reservations(root), leases=ks.leases(root), nodes=ks.nodes(root, path.ctx_id),
            ledger=ks.ledger(root), levels=self.store.level_keys(path), slices=ks.slices(root),
            fin=ks.finished(root))

    def take_op(self, path: Path, slice_id: str, owner: str, owner_ms: int,
                want: Mapping[str, tuple[int, int]], *, return_on_expiry: bool,
                below_ppm: int = 0, low_least: int = 0) -> Op:
        """The op taking a slice for ``owner`` (counted among the tree's lessees for
        ``owner_ms``): ``want`` maps a dimension to (amount wanted, least);
        ``return_on_expiry``: its unflushed part is given back, not charged, if its
        process dies; ``below_ppm``: the model ladder's threshold the reply's ``low``
        is judged by (0: none); ``low_least``: the least USD worth taking when low (a
        ladder call's cheapest rung; 0: usd's least)."""
        ks, root = self.ks, path.root
        keys = LEASE_TAKE.key_list(res=ks.reservations(root), leases=ks.leases(root),
                                   slices=ks.slices(root), lessees=ks.lessees(root),
                                   levels=[ks.ctx(root, cid) for cid in path.ids])
        args = LEASE_TAKE.arg_list(
            slice_id=slice_id, lease_ms=self.store.lease_ms, path=",".join(path.ids),
            share_divisor=SHARE_DIVISOR, owner=owner, owner_ms=owner_ms,
            return_on_expiry=return_on_expiry, below=below_ppm, low_least=low_least,
            wants=[x for dim, (amount, least) in want.items() for x in (dim, amount, least)])
        return Op(LEASE_TAKE.script, keys, args)

    def flush_op(self, path: Path, slice_id: str, batch: Batch, *, give_back: bool) -> Op:
        """The op writing ``batch`` (and with ``give_back`` returning the slice's rest)."""
        args = LEASE_FLUSH.arg_list(
            slice_id=slice_id, abort_channel=self.ks.abort_channel,
            ledger_channel=self.ks.ledger_channel, node_cap=NODE_STREAM_CAP,
            give_back=give_back, path=",".join(path.ids), batch=batch.seq,
            node_records=batch.nodes, events=batch.events,
            spent=[x for dim, amount in batch.spent.items() if amount for x in (dim, amount)])
        # a give-back ends the slice's lease renewal once it lands (if it was queued)
        return Op(LEASE_FLUSH.script, self._keys(path), args,
                  reservation_id=slice_id if give_back and slice_id else None)

    def take_and_flush(self, ops: Sequence[Op]) -> list[Any]:
        """Run ops in one round trip (a flush of the old slice, then the take of a new
        one); replies in order, script errors in place."""
        return self.wire.round_trip(ops)

    def flush(self, path: Path, op: Op) -> list[Stop]:
        """Run one flush now; the levels it stopped."""
        reply = self.wire.run(op)
        return (decode_stops(path, reply) if reply and int(reply[0]) != FinishCode.ALREADY
                else [])

    def queue(self, op: Op) -> None:
        """Send ``op`` with the next round trip (the flusher retries it while Redis is
        away)."""
        self.wire.queue(op)

    def reclaim(self, root: str, slice_id: str, record: ReservationRecord) -> None:
        """Queue the reclaim of an expired slice: flushed spend stays, the unflushed part
        is charged as used (or given back, for a slice taken with ``return_on_expiry``;
        the script sets the node's cost to what it charged)."""
        path = Path(root, record.path)
        now = time.time()
        node: NodeFields = {
            "node_id": slice_id, "kind": "llm", "operation_name": "(lease slice reclaimed)",
            "start_ts": now, "end_ts": now, "status": NodeStatus.HALTED,
            "cost_usd": 0.0}
        self.wire.queue(Op(LEASE_RETURN.script, self._keys(path), LEASE_RETURN.arg_list(
            slice_id=slice_id, node=encode_node(node), node_cap=NODE_STREAM_CAP,
            abort_channel=self.ks.abort_channel, ledger_channel=self.ks.ledger_channel)))
