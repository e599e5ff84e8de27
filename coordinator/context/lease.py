"""Lease mode, the in-process side: a slice of a context's budget taken from Redis in one
atomic step, calls served from it without a round trip, their spend written behind in
batches, and the rest given back at close, at the slice's age-out or on a stop.

The invariant kept: in Redis, the slice is held at every level like a reservation, so
(slices + spend) stays under every ceiling; locally, a call is served only when the
slice's amounts not yet spent or promised to calls in flight cover its estimate."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..core.paths import Path
from ..models import LeasePolicy
from ..models_records import NodeFields, encode_node
from ..runtime.coordinator import Coordinator
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown, is_stall
from ..store.leases_store import SLICE_PREFIX, Batch, LeaseStore, NotTaken, decode_take
from ..store.records import ReservationRecord
from ..store.tree import Stop, decode_stops
from .lease_rungs import served_rung

FLUSH_AFTER_S = 0.05
"""A batch is written at most this long after its first call finished..."""
BATCH_MAX = 256
"""...or as soon as this many calls are in it."""
RETRY_TAKE_S = 0.05
"""After a slice was refused (near a ceiling), calls needing as much take strict reserves
this long before a slice is asked for again."""

Expired = list[tuple[str, ReservationRecord]]
Filled = tuple[int, list[NodeFields], dict[str, int]]
"""A batch taken to be written: its number, node records and amounts spent."""


class LeaseSlice:
    """One process's slice of one context's budget (thread-safe)."""

    def __init__(self, coord: Coordinator, path: Path, policy: LeasePolicy,
                 below_ppm: int = 0) -> None:
        self.coord = coord
        self.path = path
        self.policy = policy
        self.below_ppm = below_ppm
        """The context's model ladder threshold (Degrade.below, ppm; 0: none)."""
        self.low = False
        """Some level of the path was below that threshold when the slice was taken."""
        self.leases = LeaseStore(coord.store)
        # at most half the coordinator's lease: a slice is given back (its batches
        # written) well before Redis could think its process dead and reclaim it
        self.max_age_s = min(policy.max_age_ms, coord.store.lease_ms // 2) / 1000
        self.want: dict[str, int] = {"usd": round(policy.usd * 1_000_000),
                                     "steps": policy.steps}
        if policy.tokens is not None:
            self.want.update(tin=policy.tokens, tout=policy.tokens)
        self.pid = os.getpid()
        self.owner = secrets.token_hex(8)
        self.owner_ms = 2 * policy.max_age_ms + 1000
        """How long this owner counts among the tree's lessees after asking."""
        self._lock = threading.Lock()  # the counters below
        self._flush_lock = threading.Lock()  # one flush or take at a time, in order
        self.slice_id: str | None = None
        self.avail: dict[str, int] = {}
        """The slice's amounts not spent nor promised to calls in flight."""
        self.expires = 0.0  # monotonic time of the slice's age-out
        self.inflight = 0
        self.stopped: str | None = None
        self.closed = False
        self._retry_at = 0.0
        self._refused: dict[str, int] = {}
        self._seq = 1  # the batch being filled
        self._records: list[NodeFields] = []
        """The batch's node records, encoded when it is written (off the calls' path)."""
        self._spent: dict[str, int] = {}
        """The batch's amounts by dimension (see ``Batch.spent``)."""
        self._flush_scheduled = False

    # -- the stop listener's target ------------------------------------------------------

    @property
    def tree_path(self) -> Path:
        return self.path

    def handle_stop(self, reason: str) -> None:
        """A stop reached this process: no call is served from the slice any more; it is
        given back at once (or when the calls in flight finish)."""
        self.stopped = reason
        if self.inflight == 0 and self.pid == os.getpid():
            self.coord.call_later(0, self._give_back_now)

    def handle_lift(self, reasons: frozenset[str]) -> None:
        """A stop for ``reasons`` was lifted (Coordinator.set_limits): slices are taken
        again (one given back at the stop stays given back)."""
        with self._lock:
            if self.stopped in reasons:
                self.stopped = None

    # -- serving -------------------------------------------------------------------------

    def serve(self, amounts: Sequence[str | int]) -> bool:
        """Promise a call's estimate from the slice, without a round trip. False: the
        caller takes a strict reserve (no slice, stopped, or the call does not fit)."""
        with self._lock:
            return (self.slice_id is not None and self.stopped is None
                    and time.monotonic() < self.expires and self._promise(amounts))

    def serve_rung(self, amounts: Sequence[str | int], rungs: Sequence[str | int]) -> int:
        """Promise a ladder call's estimate from the slice on the rung ``served_rung``
        chooses (``amounts``: usd first, at the requested rung's worst case); the rung's
        number (from 1), or 0: the caller takes a new slice or a strict reserve."""
        if not self.low:  # the requested model if it fits (served_rung): as serve
            return int(self.serve(amounts))
        with self._lock:
            if (self.slice_id is None or self.stopped is not None
                    or time.monotonic() >= self.expires):
                return 0
            return self._promise_rung(amounts, rungs)

    def _promise_rung(self, amounts: Sequence[str | int], rungs: Sequence[str | int]) -> int:
        if not self.low:
            return int(self._promise(amounts))
        rung = served_rung(rungs, self.avail.get("usd", 0), True)
        if not rung:
            return 0
        held = amounts if rung == 1 else ["usd", rungs[2 * rung - 1], *amounts[2:]]
        return rung if self._promise(held) else 0

    def _promise(self, amounts: Sequence[str | int]) -> bool:
        avail = self.avail
        pairs = [(str(amounts[i]), int(amounts[i + 1])) for i in range(0, len(amounts), 2)]
        for dim, amount in pairs:
            if amount and avail.get(dim, -1) < amount:
                return False
        for dim, amount in pairs:
            if dim in avail:
                avail[dim] -= amount
        self.inflight += 1
        return True

    def refill(self, amounts: Sequence[str | int], rungs: Sequence[str | int] = ()
               ) -> tuple[int, Expired, list[Stop]]:
        """Give the old slice back and take a new one (one round trip), then serve the
        call from it (a ladder call, ``rungs``, as ``serve_rung`` does). Returns (served:
        0, else 1 or the rung's number; expired reservations to reap; stops heard).
        Raises UNAVAILABLE when Redis cannot be reached."""
        need = {str(amounts[i]): int(amounts[i + 1]) for i in range(0, len(amounts), 2)
                if int(amounts[i + 1])}
        # a ladder call: a slice taken below its threshold need only cover the cheapest
        # rung, one above it the requested model (lease_take.lua low_least)
        low_least = min(int(a) for a in rungs[1::2]) if rungs else 0
        if self.policy.tokens is not None:  # a provider's tokens too (openai.tin, ...)
            for dim in need:
                if dim.endswith((".tin", ".tout")):
                    self.want.setdefault(dim, self.policy.tokens)
        if (self.stopped is not None or self.closed
                or any(d not in self.want or a > self.want[d] for d, a in need.items()
                       if not (d == "usd" and low_least))
                or low_least > self.want["usd"]):
            return 0, [], []  # a call larger than a slice takes a strict reserve
        if time.monotonic() < self._retry_at and all(
                a >= self._refused.get(d, 0) for d, a in need.items()):
            return 0, [], []  # a slice for as much was refused a moment ago
        with self._flush_lock:
            with self._lock:
                if self.inflight:  # calls in flight hold the old slice: no refill now
                    return 0, [], []
                old, filled = self.slice_id, self._take_batch()
                self.slice_id, self.avail = None, {}
            batch = _encoded(filled)
            ops = []
            if old is not None or batch.nodes:
                ops.append(self.leases.flush_op(self.path, old or "", batch, give_back=True))
            new_id = SLICE_PREFIX + secrets.token_hex(12)
            ops.append(self.leases.take_op(self.path, new_id, self.owner, self.owner_ms, {
                dim: (amount, need.get(dim, 0)) for dim, amount in self.want.items()},
                return_on_expiry=self.policy.return_on_expiry, below_ppm=self.below_ppm,
                low_least=low_least))
            try:
                results = self.leases.take_and_flush(ops)
            except UNAVAILABLE:
                if len(ops) == 2:
                    self.leases.queue(ops[0])
                    self.coord.schedule_flush()
                raise
            stops: list[Stop] = []
            if old is not None:
                self.leases.wire.untrack(old)
            if len(ops) == 2 and not isinstance(results[0], Exception):
                stops = _stops(self.path, results[0])
            if isinstance(results[-1], Exception):
                raise results[-1]
            taken = decode_take(results[-1])
            if isinstance(taken, NotTaken):
                self._retry_at, self._refused = time.monotonic() + RETRY_TAKE_S, need
                return 0, [], stops
            self.coord.observe_redis_time(taken.now_ms)
            self.leases.wire.track(new_id, self.path.root)
            with self._lock:
                self.slice_id, self.avail = new_id, dict(taken.amounts)
                self.expires = time.monotonic() + self.max_age_s
                self.low = taken.low
                served = 0
                if self.stopped is None:
                    served = (self._promise_rung(amounts, rungs) if rungs
                              else int(self._promise(amounts)))
            self.coord.call_later(self.max_age_s, lambda: self._age_out(new_id))
            if self.stopped is not None:
                self.coord.call_later(0, self._give_back_now)
            return served, taken.expired, stops

    # -- settling ------------------------------------------------------------------------

    def settle(self, held: dict[str, int], outcome: str, node: NodeFields,
               amounts: Sequence[str | int], *, now: bool) -> str | None:
        """A call served from the slice ended: release its promise, count what it spent in
        the batch, without a round trip (``node``, its record, is encoded when the batch
        is written: it must not change after). Returns what must be written now:
        "give_back" (the slice's last call after a stop or close), "flush" (asked ``now``,
        or the slice overspent, or the batch full), else None (written within
        FLUSH_AFTER_S)."""
        with self._lock:
            avail, spent = self.avail, self._spent
            for dim, amount in held.items():
                if dim in avail:
                    avail[dim] += amount
            for i in range(0, len(amounts), 2):
                dim, amount = str(amounts[i]), int(amounts[i + 1])
                if amount:
                    spent[dim] = spent.get(dim, 0) + amount
                    if dim in avail:
                        avail[dim] -= amount
            if outcome == "ok":
                spent["steps"] = spent.get("steps", 0) + 1
                if "steps" in avail:
                    avail["steps"] -= 1
            elif outcome == "error":
                spent["retries"] = spent.get("retries", 0) + 1
            self._records.append(node)
            self.inflight -= 1
            ending = self.inflight == 0 and (self.stopped is not None or self.closed)
            now = now or ending or len(self._records) >= BATCH_MAX or min(
                avail.values(), default=0) < 0
            schedule = not now and not self._flush_scheduled
            if schedule:
                self._flush_scheduled = True
        if ending:
            return "give_back"
        if now:
            return "flush"
        if schedule:
            self.coord.call_later(FLUSH_AFTER_S, self._timed_flush)
        return None

    def flush(self, *, give_back: bool = False) -> list[Stop]:
        """Write the batch now (one round trip); with ``give_back`` also return the rest
        of the slice. When Redis is away the write stays queued on the wire. A forked
        child never writes its parent's slice (it takes its own)."""
        if self.pid != os.getpid():
            return []
        with self._flush_lock:
            with self._lock:
                filled = self._take_batch()
                slice_id = self.slice_id
                if give_back and self.inflight:
                    give_back = False  # its calls in flight hold it: the last one returns it
                if give_back:
                    self.slice_id, self.avail = None, {}
            batch = _encoded(filled)
            if not batch.nodes and not (give_back and slice_id):
                return []
            op = self.leases.flush_op(self.path, slice_id or "", batch, give_back=give_back)
            backend = self.coord.backend
            try:
                key = self.leases.ks.reservations(self.path.root)
                if not backend.allow(key):  # Redis is away: queue it, wait for nothing
                    raise BackendDown()
                stops = self.leases.flush(self.path, op)
            except UNAVAILABLE as exc:
                if is_stall(exc):
                    backend.failed(exc, self.leases.ks.reservations(self.path.root))
                self.leases.queue(op)
                self.coord.schedule_flush()
                return []
            if give_back and slice_id:
                self.leases.wire.untrack(slice_id)
            return stops

    def give_back(self) -> list[Stop]:
        """Write the batch and return what the slice did not use."""
        return self.flush(give_back=True)

    def close(self) -> None:
        """The context's handle closes: no more calls; the slice goes back now."""
        self.closed = True
        self.give_back()

    # -- internals -----------------------------------------------------------------------

    def _take_batch(self) -> Filled:
        """The batch filled so far, a new one started (under the lock)."""
        filled = self._seq, self._records, self._spent
        self._seq, self._records, self._spent = self._seq + 1, [], {}
        self._flush_scheduled = False
        return filled

    def _give_back_now(self) -> None:
        self.give_back()

    def _timed_flush(self) -> None:
        if self._flush_scheduled:
            self.flush()

    def _age_out(self, slice_id: str) -> None:
        """The slice reached its age: give it back unless calls are in flight (the last
        one to finish gives it back) or it was already replaced."""
        if self.slice_id != slice_id:
            return
        if self.inflight:
            self.coord.call_later(FLUSH_AFTER_S, lambda: self._age_out(slice_id))
        else:
            self.give_back()


def _encoded(filled: Filled) -> Batch:
    """The batch to write, its node records encoded (outside the lock, once per batch)."""
    seq, records, spent = filled
    return Batch(seq, [encode_node(record) for record in records], [], spent)


def _stops(path: Path, reply: Any) -> list[Stop]:
    return decode_stops(path, reply) if reply and int(reply[0]) != 0 else []
