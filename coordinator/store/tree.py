"""Tree operations: the Lua scripts that open, reserve, settle, abort and close the
contexts of one tree, each reply decoded once into a typed result, and the reads of a
tree's state."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ..core.contracts import (
    ABORT,
    APPEND,
    CLOSE,
    EVENT_ONCE,
    REFUSAL,
    RELEASE,
    RENEW,
    RESERVE,
    SETTLE,
)
from ..core.data_keys import DataKeys
from ..core.keys import KeySpace
from ..core.paths import Path
from ..core.script_constants import EVENT_STREAM_CAP, NODE_STREAM_CAP
from ..core.vocabulary import FinishOutcome
from ..models_records import NodeFields, encode_node, node_facts
from .closing import expire_closed_tree, index_writes, on_tree_node, send_or_queue
from .cluster_routing import relearn
from .errors import UNAVAILABLE
from .opening import Opened, OpenRefused, open_context
from .records import ReservationRecord
from .replies import (
    AbortReply,
    Finished,
    Held,
    Refused,
    Replayed,
    State,
    Stop,
    decode_abort,
    decode_close,
    decode_finish,
    decode_reserve,
    decode_stops,
    note_finish,
)
from .requests import PLAIN, EdgeTerms
from .resend import run_resending
from .scripts import Scripts
from .state_check import readable
from .topology import Client
from .wire import Op, Wire, command, raise_errors

__all__ = ["AbortReply", "Finished", "Held", "Opened", "OpenRefused", "Refused", "Replayed",
           "ReservationRecord", "State", "Stop", "Store", "decode_abort", "decode_close",
           "decode_finish", "decode_reserve", "decode_stops", "note_finish"]

_SETTLE_LATE = SETTLE.slot("late")
_RELEASE_LATE = RELEASE.slot("late")
"""Where the late flag sits in a settle's and a release's ARGV (store/lateness.py sets it
at each send)."""


class Store:
    """Runs the tree scripts of one tenant's key space against one Redis client."""

    def __init__(self, client: Client, keyspace: KeySpace, lease_ms: int) -> None:
        self.client = client
        self.ks = keyspace
        self.scripts = Scripts(client)
        self.wire = Wire(client, self.scripts, lease_ms)
        self.lease_ms = lease_ms
        self._level_keys: Callable[[Path], tuple[str, ...]] = functools.lru_cache(
            maxsize=4096)(self._compute_level_keys)
        self._finish_keys: Callable[[Path], tuple[str, ...]] = functools.lru_cache(
            maxsize=4096)(self._compute_finish_keys)
        self._reserve_keys: Callable[[Path], tuple[str, ...]] = functools.lru_cache(
            maxsize=4096)(self._compute_reserve_keys)

    def _compute_level_keys(self, path: Path) -> tuple[str, ...]:
        out: list[str] = []
        for cid in path.ids:
            out += [self.ks.ctx(path.root, cid), self.ks.events(path.root, cid)]
        return tuple(out)

    def level_keys(self, path: Path) -> tuple[str, ...]:
        """Per level of ``path``, root first: its context hash and its event list."""
        return self._level_keys(path)

    def _compute_finish_keys(self, path: Path) -> tuple[str, ...]:
        # settle.lua and release.lua take the same KEYS (tests/unit/test_contracts.py)
        ks, root = self.ks, path.root
        return tuple(SETTLE.key_list(
            res=ks.reservations(root), leases=ks.leases(root), nodes=ks.nodes(root, path.ctx_id),
            ledger=ks.ledger(root), levels=self._level_keys(path), fin=ks.finished(root),
            done=ks.done(root), bymodel=ks.by_model(root)))

    def _compute_reserve_keys(self, path: Path) -> tuple[str, ...]:
        ks, root = self.ks, path.root
        return tuple(RESERVE.key_list(res=ks.reservations(root), leases=ks.leases(root),
                                      levels=self._level_keys(path), done=ks.done(root)))

    def flush(self, root: str | None = None) -> None:
        """Make every queued write land (see :meth:`Wire.flush`); with ``root``, only
        those for its tree's node (another Cluster primary may be down). A node that
        does not answer makes a Cluster's slot map re-learnt (a replica may have taken
        over its slots) before the error is raised."""
        try:
            self.wire.flush(on_tree_node(self.ks, root) if root else ())
        except UNAVAILABLE:
            relearn(self.wire.topology)
            raise

    # -- operations ----------------------------------------------------------------------

    def open(self, path: Path, *, request_id: str, meta_json: str, config_json: str,
             timeout_ms: int, deadline_ms: int, triples: Sequence[str | int],
             fields: Sequence[str | int] = ()) -> Opened | OpenRefused:
        """Create a context (see :func:`~coordinator.store.opening.open_context`)."""
        return open_context(self.wire, self.ks, path, request_id=request_id,
                            meta_json=meta_json, config_json=config_json,
                            timeout_ms=timeout_ms, deadline_ms=deadline_ms, triples=triples,
                            fields=fields)

    def reserve(self, path: Path, reservation_id: str, amounts: Sequence[str | int], *,
                keyed: bool = False, resend: bool = True, terms: EdgeTerms = PLAIN
                ) -> Held | Refused | Replayed:
        """Hold ``amounts`` at every level of ``path`` (one round trip, which also carries
        the queued writes). ``keyed``: the id is a keyed call id whose outcome is kept, so
        a replay of a finished call is recognised. ``resend``: sent once more when the
        first got no answer (store/resend.py). ``terms``: the final reserve and the model
        ladder (reserve.lua)."""
        try:
            reply = run_resending(self.wire, self.reserve_op(path, reservation_id, amounts,
                                                              keyed, terms), resend=resend)
        except UNAVAILABLE:
            self.unheard(path, reservation_id, keyed)
            raise
        return self.reserved(path, reservation_id, reply)

    def unheard(self, path: Path, reservation_id: str, keyed: bool) -> None:
        """A reserve whose reply did not come (Redis unreachable or not replicated)."""
        if self.wire.durability.waits and not keyed:
            # it may be held (on the primary, or on a replica about to take over) for
            # a call that will not run: let go of it rather than wait for its lease
            self.wire.queue(self._finish_op(path, reservation_id, FinishOutcome.SKIP, None,
                                            (), notify=False))

    def reserve_op(self, path: Path, reservation_id: str, amounts: Sequence[str | int],
                   keyed: bool, terms: EdgeTerms = PLAIN) -> Op:
        """The op of :meth:`reserve` (an I/O thread sends several in one round trip)."""
        return Op(RESERVE.script, list(self._reserve_keys(path)), RESERVE.arg_list(
            reservation_id=reservation_id, lease_ms=self.lease_ms, path=",".join(path.ids),
            abort_channel=self.ks.abort_channel, keyed=keyed, final=terms.final,
            below=terms.below_ppm, rungs=terms.rungs, amounts=amounts))

    def reserved(self, path: Path, reservation_id: str, reply: list[Any]
                 ) -> Held | Refused | Replayed:
        """The result of a reserve op's reply; a hold is renewed until it finishes."""
        result = decode_reserve(reply)
        if isinstance(result, Held):
            self.wire.track(reservation_id, path.root)
        return result

    def finish(self, path: Path, reservation_id: str, *, outcome: str,
               node: NodeFields | None, amounts: Sequence[str | int],
               write_behind: bool) -> list[Stop]:
        """Settle (``outcome='ok'``) or release (``'error'``, ``'skip'``) a reservation.

        Write-behind ops are queued: sent with this process's next round trip, or by the
        flusher (the caller schedules it), so the call does not wait for a send. They
        return no stops, which still happen in Redis and are broadcast."""
        op = self._finish_op(path, reservation_id, outcome, node, amounts, untrack=True)
        if write_behind:
            self.wire.queue(op)
            return []
        reply = self.wire.run(op)
        self.wire.untrack(reservation_id)
        finished = note_finish(op.kind, reservation_id, path, reply)
        return finished.stops if finished is not None else []

    def _finish_op(self, path: Path, reservation_id: str, outcome: str,
                   node: NodeFields | None, amounts: Sequence[str | int], *,
                   notify: bool = True, untrack: bool = False) -> Op:
        """The settle (``outcome='ok'``) or release op of a reservation, its late flag's
        slot from the contract, with the node record (none: ``None``) and what the script
        counts of it (node_facts). ``notify``: its reply goes to :func:`note_finish`;
        ``untrack``: its landing ends the renewal of the hold."""
        ks = self.ks
        node_json, facts = encode_node(node) if node else "", node_facts(node)
        if outcome == FinishOutcome.OK:
            script, late_at = SETTLE.script, _SETTLE_LATE
            args = SETTLE.arg_list(
                reservation_id=reservation_id, abort_channel=ks.abort_channel,
                node=node_json, node_cap=NODE_STREAM_CAP, ledger_channel=ks.ledger_channel,
                late=False, amounts=amounts, **facts)
        else:
            script, late_at = RELEASE.script, _RELEASE_LATE
            args = RELEASE.arg_list(
                reservation_id=reservation_id, abort_channel=ks.abort_channel,
                node=node_json, node_cap=NODE_STREAM_CAP, ledger_channel=ks.ledger_channel,
                outcome=outcome, late=False, amounts=amounts, **facts)
        return Op(script, list(self._finish_keys(path)), args,
                  reservation_id=reservation_id if untrack else None, late_at=late_at,
                  on_reply=functools.partial(note_finish, script, reservation_id, path)
                  if notify else None)

    def reap(self, root: str, reservation_id: str, record: ReservationRecord,
             node: NodeFields) -> None:
        """Queue the settle of an expired reservation at its held estimate (or the finish
        a corrupt counter stopped, as it was asked)."""
        path = Path(root, record.path)
        if (p := record.pending) is not None:
            self.finish(path, reservation_id, outcome=p.outcome, node=p.node(),
                        amounts=p.amounts, write_behind=True)
            return
        # settle.lua counts the step itself; the other held amounts become the actuals
        actual = [x for dim, amount in record.held_pairs() if dim != "steps"
                  for x in (dim, amount)]
        self.wire.queue(self._finish_op(path, reservation_id, FinishOutcome.OK, node, actual))

    def queue_event(self, path: Path, event_json: str) -> None:
        """Append a SafetyEvent to a context's event list with the next round trip."""
        self.wire.queue(Op(APPEND.script,
                           APPEND.key_list(events=self.ks.events(path.root, path.ctx_id)),
                           APPEND.arg_list(cap=EVENT_STREAM_CAP, entry=event_json)))

    def queue_stop_event(self, path: Path, reason: str, event_json: str) -> None:
        """Append a chain-level stop event to a context's event list with the next round
        trip, unless the context already recorded one for ``reason`` (event_once.lua)."""
        root, cid = path.root, path.ctx_id
        self.wire.queue(Op(EVENT_ONCE.script,
                           EVENT_ONCE.key_list(ctx=self.ks.ctx(root, cid),
                                               events=self.ks.events(root, cid)),
                           EVENT_ONCE.arg_list(reason=reason, event=event_json,
                                               cap=EVENT_STREAM_CAP)))

    def queue_refusal(self, path: Path, reason: str, event_json: str, node_json: str
                      ) -> None:
        """Record a call refused before it ran with the next round trip (refusal.lua: its
        node, counted on the context's hash, and the event once per reason)."""
        root, cid = path.root, path.ctx_id
        self.wire.queue(Op(REFUSAL.script,
                           REFUSAL.key_list(ctx=self.ks.ctx(root, cid),
                                            nodes=self.ks.nodes(root, cid),
                                            events=self.ks.events(root, cid)),
                           REFUSAL.arg_list(reason=reason, event=event_json, node=node_json,
                                            node_cap=NODE_STREAM_CAP)))

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
        return decode_abort(self.wire.run(self.abort_op(path, reason, detail)))

    def abort_op(self, path: Path, reason: str, detail: str) -> Op:
        """The op of :meth:`abort`, for the queue of writes (``wire.queue``)."""
        root, cid = path.root, path.ctx_id
        return Op(ABORT.script,
                  ABORT.key_list(ctx=self.ks.ctx(root, cid), events=self.ks.events(root, cid)),
                  ABORT.arg_list(reason=reason, detail=detail,
                                 abort_channel=self.ks.abort_channel, root=root, ctx_id=cid))

    def close(self, path: Path, retention_s: int) -> int:
        """Close a context, record its summary event and start the retention clock on its
        keys, with the queued writes for its node, in one round trip (the cross-tree
        index writes follow: store/closing.py). Returns the tree's spend in
        micro-USD when this closed a root first (for the cross-tree spend views, which
        count a tree once), else 0."""
        root = len(path.ids) == 1
        others = [self.ks.kids(path.root, path.ctx_id),
                  *DataKeys(self.ks).context_keys(path.root, path.ctx_id)]
        if root:
            others += [self.ks.reservations(path.root), self.ks.leases(path.root),
                       self.ks.ledger(path.root), self.ks.done(path.root),
                       self.ks.finished(path.root), *DataKeys(self.ks).tree_keys(path.root)]
        keys = CLOSE.key_list(ctx=self.ks.ctx(path.root, path.ctx_id),
                              nodes=self.ks.nodes(path.root, path.ctx_id),
                              events=self.ks.events(path.root, path.ctx_id), others=others)
        results = self.wire.round_trip([Op(CLOSE.script, keys,
                                           CLOSE.arg_list(retention_s=retention_s))])
        raise_errors(results)
        send_or_queue(self.wire, index_writes(self.ks, path, retention_s))
        if not root:
            return 0
        expire_closed_tree(self.client, self.wire, self.ks, path.root, retention_s)
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
            self.scripts.queue(pipe, RENEW.script, RENEW.key_list(leases=self.ks.leases(root)),
                               RENEW.arg_list(lease_ms=self.lease_ms, ids=ids))
        results = pipe.execute(raise_on_error=False)
        for ids, extended in zip(by_root.values(), results, strict=True):
            if extended == len(ids):  # every one still held (a reaped one is not)
                self.wire.lateness.confirm(ids)
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
                pipe.lrange(self.ks.nodes(path.root, path.ctx_id), 0, -1)
            if events:
                pipe.lrange(self.ks.events(path.root, path.ctx_id), 0, -1)
            if not self.wire.topology.is_cluster:
                pipe.time()
            else:  # the tree's own node's clock (a cluster pipeline sends no key-less TIME)
                pipe.execute_command("EVAL", "return redis.call('TIME')", 1,
                                     self.ks.ctx(path.root, path.root))

        rest = self.wire.round_trip([], reads)
        raise_errors(rest)
        hashes = [readable(h) for h in rest[: len(path.ids)]]
        i = len(path.ids)
        node_json = [str(n) for n in rest[i]] if nodes else []
        i += 1 if nodes else 0
        event_json = [str(e) for e in rest[i]] if events else []
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
