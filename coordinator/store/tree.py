"""Tree operations: the Lua scripts that open, reserve, settle, abort and close the
contexts of one tree, each reply decoded once into a typed result, and the reads of a
tree's state."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import redis

from ..core.data_keys import DataKeys
from ..core.keys import KeySpace
from ..core.paths import Path
from ..core.script_constants import EVENT_STREAM_CAP, NODE_STREAM_CAP
from .errors import UNAVAILABLE
from .opening import Opened, OpenRefused, open_context
from .records import ReservationRecord
from .retention import expire_tree
from .scripts import Scripts
from .state_check import readable
from .topology import Client
from .wire import Op, Wire, command, raise_errors

__all__ = ["AbortReply", "Finished", "Held", "Opened", "OpenRefused", "Refused", "Replayed",
           "ReservationRecord", "State", "Stop", "Store"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """A reservation that succeeded."""

    now_ms: int
    expired: list[tuple[str, ReservationRecord]]
    """Reservations of this tree whose lease expired: (reservation id, record)."""


@dataclass(frozen=True)
class Replayed:
    """A keyed call id that already finished (in an earlier delivery of the same work)."""

    outcome: str
    now_ms: int


@dataclass(frozen=True)
class Refused:
    """A reservation refused at ``level`` (0-based index into the path)."""

    level: int
    reason: str
    detail: str
    stopped: bool
    """True when the level is stopped for good; False when only this call did not fit."""
    now_ms: int


@dataclass(frozen=True)
class Stop:
    """A level that a settle or release stopped."""

    ctx_id: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Finished:
    """What settle.lua or release.lua did with a reservation: ``finished`` it; found it
    ``already`` finished (nothing changed); found a counter on the path ``corrupt``
    (nothing charged, the reservation still held, the level stopped); or found it never
    held here (lost in a failover): ``orphan_charged`` to the path all the same, or
    ``orphan_recorded`` only (the path does not exist here either). An orphan is also a
    SettleOrphaned event on the tree's ledger stream and channel."""

    outcome: Literal["finished", "already", "corrupt", "orphan_charged", "orphan_recorded"]
    stops: list[Stop]
    """The levels this call stopped."""

    @property
    def orphan(self) -> bool:
        return self.outcome.startswith("orphan")


_FINISH_OUTCOMES: dict[int, Literal["finished", "already", "corrupt", "orphan_charged",
                                    "orphan_recorded"]] = {
    0: "already", 1: "finished", 3: "corrupt", 4: "orphan_charged", 5: "orphan_recorded"}


@dataclass(frozen=True)
class AbortReply:
    """What abort.lua did: ``stopped`` it; found it ``already`` stopped or closed
    (``status`` says which reason or state); a timeout came ``early`` by Redis time
    (retry in ``wait_ms``); or the context is ``missing``."""

    outcome: Literal["stopped", "already", "early", "missing"]
    status: str | None = None
    wait_ms: int = 0


class State(NamedTuple):
    """A context's state as read in one round trip."""

    hashes: list[dict[str, str]]
    """The context hash of every level of the path, root first."""
    node_json: list[str]
    event_json: list[str]
    now_ms: int
    """Redis time."""


def decode_reserve(reply: list[Any]) -> Held | Refused | Replayed:
    """reserve.lua's reply (see its contract)."""
    if reply[0] == 2:
        return Replayed(str(reply[2]), int(reply[1]))
    if reply[0] == 1:
        expired = [(str(reply[i]), ReservationRecord.from_json(reply[i + 1]))
                   for i in range(2, len(reply), 2)]
        return Held(int(reply[1]), expired)
    return Refused(int(reply[1]) - 1, str(reply[2]), str(reply[3]), bool(reply[4]),
                   int(reply[5]))


def decode_stops(path: Path, reply: list[Any]) -> list[Stop]:
    """The levels of ``path`` a script stopped: ``reply[1:]`` as (level, reason,
    detail) triples (settle.lua, release.lua, propagate.lua)."""
    return [Stop(path.ids[int(reply[i]) - 1], str(reply[i + 1]), str(reply[i + 2]))
            for i in range(1, len(reply), 3)]


def decode_finish(path: Path, reply: list[Any]) -> Finished:
    """settle.lua's and release.lua's reply (see their contracts): the outcome by its
    code, and the levels of ``path`` the call stopped."""
    return Finished(_FINISH_OUTCOMES[int(reply[0])], decode_stops(path, reply))


def note_finish(kind: str, reservation_id: str, path: Path, reply: Any) -> Finished | None:
    """Decode a settle's or release's reply and log an orphan (the script recorded it
    with an event): what the wire calls on each write-behind reply it acknowledges."""
    if isinstance(reply, Exception):
        return None
    finished = decode_finish(path, reply)
    if finished.orphan:
        log.warning("%s %s found no reservation (lost in a failover?): %s", kind,
                    reservation_id, "charged to its path"
                    if finished.outcome == "orphan_charged" else "not charged")
    return finished


def decode_abort(reply: list[Any]) -> AbortReply:
    """abort.lua's reply."""
    code = int(reply[0])
    if code == 1:
        return AbortReply("stopped")
    if code == 0:
        return AbortReply("already", str(reply[1]) if len(reply) > 1 else None)
    if code == 2:
        return AbortReply("early", wait_ms=int(reply[1]))
    return AbortReply("missing")


def decode_close(reply: list[Any]) -> int:
    """close.lua's reply: micro-USD settled in the closed context's subtree (0 when the
    context does not exist)."""
    return int(reply[2]) if reply[0] == 1 else 0


class Store:
    """Runs the tree scripts of one tenant's key space against one Redis client."""

    def __init__(self, client: Client, keyspace: KeySpace, lease_ms: int) -> None:
        self.client = client
        self.ks = keyspace
        self.scripts = Scripts(client)
        self.wire = Wire(client, self.scripts)
        self.lease_ms = lease_ms
        self._level_keys: Callable[[Path], tuple[str, ...]] = functools.lru_cache(
            maxsize=4096)(self._compute_level_keys)
        self._finish_keys: Callable[[Path], tuple[str, ...]] = functools.lru_cache(
            maxsize=4096)(self._compute_finish_keys)

    def _compute_level_keys(self, path: Path) -> tuple[str, ...]:
        out: list[str] = []
        for cid in path.ids:
            out += [self.ks.ctx(path.root, cid), self.ks.events(path.root, cid)]
        return tuple(out)

    def level_keys(self, path: Path) -> tuple[str, ...]:
        """Per level of ``path``, root first: its context hash and its event stream."""
        return self._level_keys(path)

    def _compute_finish_keys(self, path: Path) -> tuple[str, ...]:
        return (
            self.ks.reservations(path.root),
            self.ks.leases(path.root),
            self.ks.nodes(path.root, path.ctx_id),
            self.ks.ledger(path.root),
            *self._level_keys(path),
            self.ks.finished(path.root),
            self.ks.done(path.root),
        )

    def flush(self) -> None:
        """Make every queued write land (see :meth:`Wire.flush`)."""
        self.wire.flush()

    # -- operations ----------------------------------------------------------------------

    def open(self, path: Path, *, request_id: str, meta_json: str, config_json: str,
             timeout_ms: int, deadline_ms: int, triples: Sequence[str | int]
             ) -> Opened | OpenRefused:
        """Create a context (see :func:`~coordinator.store.opening.open_context`)."""
        return open_context(self.wire, self.ks, path, request_id=request_id,
                            meta_json=meta_json, config_json=config_json,
                            timeout_ms=timeout_ms, deadline_ms=deadline_ms, triples=triples)

    def reserve(self, path: Path, reservation_id: str, amounts: Sequence[str | int], *,
                keyed: bool = False) -> Held | Refused | Replayed:
        """Hold ``amounts`` at every level of ``path`` (one round trip, which also carries
        the queued writes). ``keyed``: the id is a keyed call id whose outcome is kept, so
        a replay of a finished call is recognised."""
        try:
            reply = self.wire.run(self.reserve_op(path, reservation_id, amounts, keyed))
        except UNAVAILABLE:
            self.unheard(path, reservation_id, keyed)
            raise
        return self.reserved(path, reservation_id, reply)

    def unheard(self, path: Path, reservation_id: str, keyed: bool) -> None:
        """A reserve whose reply did not come (Redis unreachable or not replicated)."""
        if self.wire.durability.waits and not keyed:
            # it may be held (on the primary, or on a replica about to take over) for
            # a call that will not run: let go of it rather than wait for its lease
            self.wire.queue(Op("release", list(self._finish_keys(path)), [
                reservation_id, self.ks.abort_channel, "", NODE_STREAM_CAP,
                self.ks.ledger_channel, "skip"]))

    def reserve_op(self, path: Path, reservation_id: str, amounts: Sequence[str | int],
                   keyed: bool) -> Op:
        """The op of :meth:`reserve` (an I/O thread sends several in one round trip)."""
        keys = [self.ks.reservations(path.root), self.ks.leases(path.root),
                *self._level_keys(path), self.ks.done(path.root)]
        args = [reservation_id, self.lease_ms, ",".join(path.ids), self.ks.abort_channel,
                "1" if keyed else "0", *amounts]
        return Op("reserve", keys, args)

    def reserved(self, path: Path, reservation_id: str, reply: list[Any]
                 ) -> Held | Refused | Replayed:
        """The result of a reserve op's reply; a hold is renewed until it finishes."""
        result = decode_reserve(reply)
        if isinstance(result, Held):
            self.wire.track(reservation_id, path.root)
        return result

    def finish(self, path: Path, reservation_id: str, *, outcome: str,
               node: dict[str, Any] | None, amounts: Sequence[str | int],
               write_behind: bool, queue_only: bool = False) -> list[Stop]:
        """Settle (``outcome='ok'``) or release (``'error'``, ``'skip'``) a reservation.

        Write-behind ops are sent now and their replies read later (``queue_only``: not
        even sent, queued for the next round trip or the flusher, as while Redis is
        down); they return no stops, which still happen in Redis and are broadcast."""
        script = "settle" if outcome == "ok" else "release"
        args: list[Any] = [reservation_id, self.ks.abort_channel,
                           json.dumps(node) if node else "", NODE_STREAM_CAP,
                           self.ks.ledger_channel]
        if script == "release":
            args.append(outcome)
        op = Op(script, list(self._finish_keys(path)), [*args, *amounts],
                reservation_id=reservation_id,
                on_reply=functools.partial(note_finish, script, reservation_id, path))
        if queue_only:
            self.wire.queue(op)
            return []
        if write_behind:
            self.wire.send_behind(op)
            return []
        reply = self.wire.run(op)
        self.wire.untrack(reservation_id)
        finished = note_finish(script, reservation_id, path, reply)
        return finished.stops if finished is not None else []

    def reap(self, root: str, reservation_id: str, record: ReservationRecord,
             node: dict[str, Any]) -> None:
        """Queue the settle of an expired reservation at its held estimate."""
        path = Path(root, record.path)
        # settle.lua counts the step itself; the other held amounts become the actuals
        actual = [x for dim, amount in record.held_pairs() if dim != "steps"
                  for x in (dim, amount)]
        self.wire.queue(Op("settle", list(self._finish_keys(path)),
                           [reservation_id, self.ks.abort_channel, json.dumps(node),
                            NODE_STREAM_CAP, self.ks.ledger_channel, *actual],
                           on_reply=functools.partial(note_finish, "settle", reservation_id,
                                                      path)))

    def queue_event(self, path: Path, event_json: str) -> None:
        """Append a SafetyEvent to a context's event stream with the next round trip."""
        self.wire.queue(Op("xadd", [self.ks.events(path.root, path.ctx_id)], ["e", event_json]))

    def queue_stop_event(self, path: Path, reason: str, event_json: str) -> None:
        """Append a chain-level stop event to a context's event stream with the next round
        trip, unless the context already recorded one for ``reason`` (event_once.lua)."""
        self.wire.queue(Op("event_once", [self.ks.ctx(path.root, path.ctx_id),
                                          self.ks.events(path.root, path.ctx_id)],
                           [reason, event_json, EVENT_STREAM_CAP]))

    def queue_node(self, path: Path, node_json: str) -> None:
        """Append a node record to a context's node stream with the next round trip."""
        self.wire.queue(Op("xadd", [self.ks.nodes(path.root, path.ctx_id)], ["n", node_json]))

    def run_scripts(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
                    ) -> list[Any]:
        """Run named scripts (name, KEYS, ARGV) in one round trip with the queued writes;
        replies in order, for their sender to decode. A script error is raised (the
        shield's scripts use this)."""
        results = self.wire.round_trip([Op(name, list(keys), list(args))
                                        for name, keys, args in calls])
        raise_errors(results)
        return results

    def publish_ledger(self, path: Path, event_json: str) -> None:
        """Append a ledger event to the tree's stream and publish it (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.ks.ledger(path.root), {"e": event_json}, maxlen=EVENT_STREAM_CAP,
                  approximate=True)
        if not self.wire.topology.is_cluster:
            pipe.publish(self.ks.ledger_channel, event_json)
        pipe.execute()
        if self.wire.topology.is_cluster:  # a cluster pipeline sends no PUBLISH
            self.client.publish(self.ks.ledger_channel, event_json)

    def abort(self, path: Path, reason: str, detail: str) -> AbortReply:
        """Stop the context named by ``path`` and, with it, its subtree."""
        keys = [self.ks.ctx(path.root, path.ctx_id), self.ks.events(path.root, path.ctx_id)]
        args = [reason, detail, self.ks.abort_channel, path.root, path.ctx_id]
        return decode_abort(self.wire.run(Op("abort", keys, args)))

    def close(self, path: Path, retention_s: int) -> int:
        """Close a context, record its summary event and start the retention clock on its
        keys, with the queued writes, in one round trip. Returns the tree's spend in
        micro-USD when this closed a root (for the cross-tree spend views), else 0."""
        root = len(path.ids) == 1
        keys = [
            self.ks.ctx(path.root, path.ctx_id),
            self.ks.nodes(path.root, path.ctx_id),
            self.ks.events(path.root, path.ctx_id),
            self.ks.kids(path.root, path.ctx_id),
            *DataKeys(self.ks).context_keys(path.root, path.ctx_id),
        ]
        if root:
            keys += [self.ks.reservations(path.root), self.ks.leases(path.root),
                     self.ks.ledger(path.root), self.ks.done(path.root),
                     self.ks.finished(path.root), *DataKeys(self.ks).tree_keys(path.root)]
        ops = [Op("close", keys, [retention_s]),
               command("EXPIRE", self.ks.locator(path.ctx_id), retention_s)]
        if root:
            ops.append(command("ZREM", self.ks.roots_shard(path.root), path.root))
        results = self.wire.round_trip(ops)
        raise_errors(results)
        if not root:
            return 0
        expire_tree(self.client, self.ks, path.root, retention_s)  # contexts never closed too
        return decode_close(results[0])

    def expire_context(self, path: Path, retention_s: int) -> None:
        """Start the retention clock on a context's keys without closing it (work may
        still run under it), with the queued writes, in one round trip."""
        raise_errors(self.wire.round_trip([command("EXPIRE", key, retention_s) for key in (
            self.ks.ctx(path.root, path.ctx_id), self.ks.nodes(path.root, path.ctx_id),
            self.ks.events(path.root, path.ctx_id), self.ks.kids(path.root, path.ctx_id),
            self.ks.locator(path.ctx_id),
            *DataKeys(self.ks).context_keys(path.root, path.ctx_id))]))

    def renew_leases(self) -> None:
        """Extend the leases of this process's calls in flight (one round trip)."""
        by_root = self.wire.inflight_by_root()
        if not by_root:
            return
        pipe = self.client.pipeline(transaction=False)
        for root, ids in by_root.items():
            self.scripts.queue(pipe, "renew", [self.ks.leases(root)], [self.lease_ms, *ids])
        results = pipe.execute(raise_on_error=False)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
            self.scripts.load()

    # -- reads ---------------------------------------------------------------------------

    def read_hash(self, root: str, ctx_id: str) -> dict[str, str]:
        return readable({str(k): str(v)
                         for k, v in self.client.hgetall(self.ks.ctx(root, ctx_id)).items()})

    def read_state(self, path: Path, *, nodes: bool = True, events: bool = True) -> State:
        """The hashes of every level, the node and event JSON of the context, and the
        Redis time (ms), in one round trip (after the queued writes)."""
        def reads(pipe: Any) -> None:
            for cid in path.ids:
                pipe.hgetall(self.ks.ctx(path.root, cid))
            if nodes:
                pipe.xrange(self.ks.nodes(path.root, path.ctx_id))
            if events:
                pipe.xrange(self.ks.events(path.root, path.ctx_id))
            if not self.wire.topology.is_cluster:
                pipe.time()
            else:  # the tree's own node's clock (a cluster pipeline sends no key-less TIME)
                pipe.execute_command("EVAL", "return redis.call('TIME')", 1,
                                     self.ks.ctx(path.root, path.root))

        rest = self.wire.round_trip([], reads)
        raise_errors(rest)
        hashes = [readable(h) for h in rest[: len(path.ids)]]
        i = len(path.ids)
        node_json = [e[1]["n"] for e in rest[i]] if nodes else []
        i += 1 if nodes else 0
        event_json = [e[1]["e"] for e in rest[i]] if events else []
        sec, usec = rest[-1]
        return State(hashes, node_json, event_json, int(sec) * 1000 + int(usec) // 1000)

    def read_stops(self, paths: Sequence[Path]) -> list[list[str]]:
        """For each path, the stop reasons of its stopped levels, root first (one round
        trip): what a listener that missed broadcasts must apply."""
        pipe = self.client.pipeline(transaction=False)
        for path in paths:
            for cid in path.ids:
                pipe.hmget(self.ks.ctx(path.root, cid), "status", "reason")
        results = iter(pipe.execute())
        out: list[list[str]] = []
        for path in paths:
            levels = [next(results) for _ in path.ids]
            out.append([str(reason) for status, reason in levels if status == "stopped"])
        return out

    def children(self, root: str, ctx_id: str) -> list[str]:
        return sorted(str(k) for k in self.client.smembers(self.ks.kids(root, ctx_id)))

    def server_time_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000
