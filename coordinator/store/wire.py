"""The write-behind wire: sends script calls and commands to Redis in pipelined round trips,
each thread on its own connection (one per cluster node), and carries the queued writes
(settles, events) along with the next round trip or the flusher's drain."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.script_constants import EVENT_STREAM_CAP
from .cluster_routing import not_replicated, queued_for_nodes
from .errors import MOVED, tag_node
from .health import set_timeouts
from .lateness import Lateness
from .scripts import Scripts
from .topology import Client, Durability, Wires
from .wire_conn import ThreadConn, ThreadConns, pack, read_reply

MAX_ATTEMPTS = 5
"""How many times a queued write is sent before it is given up (its lease then charges
the estimate)."""


def raise_errors(results: Sequence[Any]) -> None:
    """Raise the first error among the replies of a round trip."""
    for r in results:
        if isinstance(r, Exception):
            raise r


@dataclass
class Op:
    """One command to send: a script call (``kind`` is the script's name), a stream
    append (``xadd``) or a plain command (``cmd``, ``args`` is the whole command)."""

    kind: str
    keys: list[str]
    args: list[Any]
    reservation_id: str | None = None
    """The reservation this op finishes: its lease stops being renewed once it lands."""
    attempts: int = field(default=0)
    on_reply: Callable[[Any], object] | None = field(default=None, compare=False)
    """Called with the reply of a write-behind or queued op once it is acknowledged."""
    late_at: int | None = None
    """A settle's or release's: where in ``args`` its late flag goes (lateness.py)."""
    first_sent: float = 0.0

    @property
    def key(self) -> str | None:
        """The key that places the op on a cluster node (a command's first argument)."""
        if self.keys:
            return self.keys[0]
        return str(self.args[1]) if self.kind == "cmd" and len(self.args) > 1 else None


_WAIT = Op("wait", [], [])  # a WAIT after the ops it covers (replicated durability)


def command(*args: Any) -> Op:
    """A plain Redis command as an op."""
    return Op("cmd", [], list(args))


class Wire:
    """Round trips and write-behind for one Redis client, and the reservations in flight
    (sent by this process and not yet finished) whose leases need renewing."""

    def __init__(self, client: Client, scripts: Scripts, lease_ms: int) -> None:
        self.client = client
        self.lateness = Lateness(lease_ms)
        self.scripts = scripts
        self.topology = Wires(client)
        self.durability = Durability()
        self._pending: list[Op] = []
        self._lock = threading.Lock()
        self._inflight: dict[str, str] = {}  # reservation id -> root, for lease renewal
        self._local = threading.local()
        self._thread_conns: weakref.WeakSet[ThreadConns] = weakref.WeakSet()
        self._conns_lock = threading.Lock()
        # Batches of queued writes taken off the queue and not yet landed, by number: a
        # read waits for those taken before it (read-your-writes).
        self._batch_seq = 0
        self._open_batches: set[int] = set()
        self._landed = threading.Condition()
        self._pid = os.getpid()
        self.hot_timeout_s: float | None = None
        """Connect and reply timeout of this wire's connections (None: the client's)."""

    # -- reservations in flight ----------------------------------------------------------

    def track(self, reservation_id: str, root: str) -> None:
        """A reservation now held in ``root``'s tree: renew its lease until it finishes."""
        self._inflight[reservation_id] = root
        self.lateness.confirm((reservation_id,))

    def untrack(self, reservation_id: str) -> None:
        self._inflight.pop(reservation_id, None)
        self.lateness.forget(reservation_id)

    def inflight_by_root(self) -> dict[str, list[str]]:
        """The reservations in flight, by the root of their tree."""
        by_root: dict[str, list[str]] = {}
        for reservation_id, root in list(self._inflight.items()):
            by_root.setdefault(root, []).append(reservation_id)
        return by_root

    # -- round trips ---------------------------------------------------------------------

    def round_trip(self, ops: Sequence[Op], reads: Callable[[Any], None] | None = None
                   ) -> list[Any]:
        """Run every queued write, then ``ops``, then ``reads`` (a function queueing reads
        on a redis-py pipeline), in one round trip. Returns the results after the queued
        writes', script errors in place as exceptions. Raises redis.ConnectionError /
        TimeoutError when Redis cannot be reached (the queued writes stay queued).
        ``reads`` see every write this process made before the call (read-your-writes)."""
        return self._send_queued(ops, reads, after_earlier=reads is not None)

    def run(self, op: Op) -> Any:
        """The reply of one op, sent with the queued writes; a script error is raised."""
        result = self.round_trip([op])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def queue(self, op: Op) -> None:
        """Queue ``op`` for the next round trip (or the flusher)."""
        with self._lock:
            self._pending.append(op)

    def flush(self, along: Sequence[Op] = ()) -> None:
        """Make every write-behind op land: wait for the queued writes other threads are
        sending, and send what is queued (on a Cluster, with ``along``, only what is
        queued for the nodes of ``along``). Raises if Redis is unreachable; the writes
        stay queued."""
        self._send_queued([], None, after_earlier=True, along=along)

    def write_mark(self) -> int:
        """A mark for :meth:`wrote_since`: the batches of queued writes numbered above it
        are those in flight now and those taken off the queue later."""
        with self._lock:
            return min(self._open_batches) - 1 if self._open_batches else self._batch_seq

    def wrote_since(self, mark: int) -> bool:
        """Whether queued writes of this process were in flight at ``mark`` or were sent
        since: a round trip made meanwhile may have reached Redis before them."""
        return self._batch_seq > mark

    # -- read-your-writes ----------------------------------------------------------------

    def _send_queued(self, ops: Sequence[Op], reads: Callable[[Any], None] | None, *,
                     after_earlier: bool, along: Sequence[Op] = ()) -> list[Any]:
        """:meth:`round_trip`; with ``after_earlier``, every write this process made
        before the call lands first: the batches of queued writes that other threads (the
        flusher) took off the queue before this call took its own are sent."""
        pending, batch, taken_at = self._take_pending(along or (ops if reads is None else ()))
        try:
            if after_earlier:
                self._await_batches(taken_at, batch)
            if not pending and not ops and reads is None:
                return []
            try:
                results = self._execute([*pending, *ops], reads)
            except redis.RedisError:
                self._requeue(pending)
                raise
            # acknowledged before the batch counts as landed: a failed op is back in the
            # queue by then, for the next reader to send
            self._acknowledge(pending, results[: len(pending)])
        finally:
            if batch:
                with self._lock:
                    self._open_batches.discard(batch)
                with self._landed:
                    self._landed.notify_all()
        return results[len(pending):]

    def _await_batches(self, upto: int, own: int, timeout: float = 10.0) -> None:
        """Wait until the batches numbered up to ``upto`` (except ``own``) have landed.
        A batch's sender never waits for a later batch, so this cannot deadlock."""
        end = time.monotonic() + timeout
        with self._landed:
            while True:
                with self._lock:
                    earlier = any(b <= upto and b != own for b in self._open_batches)
                left = end - time.monotonic()
                if not earlier or left <= 0:
                    return
                self._landed.wait(left)

    # -- internals -----------------------------------------------------------------------

    def _execute(self, ops: Sequence[Op], reads: Callable[[Any], None] | None) -> list[Any]:
        """Run ops (then reads) in one pipelined round trip.

        Ops that hit NOSCRIPT (the server's script cache was flushed) are re-sent once
        after reloading the scripts, followed by the reads again, so the reads see them;
        ops that succeeded are not repeated."""
        results = self._send(ops, reads)
        missing = [i for i, r in enumerate(results[: len(ops)])
                   if isinstance(r, (redis.exceptions.NoScriptError, *MOVED))]
        if not missing:
            return results
        if any(isinstance(results[i], MOVED) for i in missing):
            self.topology.refresh()  # the cluster's slots moved: re-learn, send again
        self.scripts.load()
        again = self._send([ops[i] for i in missing], reads)
        for j, i in enumerate(missing):
            results[i] = again[j]
        return results[: len(ops)] + again[len(missing):]

    def _send(self, ops: Sequence[Op], reads: Callable[[Any], None] | None) -> list[Any]:
        if reads is None:
            return self._send_raw(ops)
        if ops and self.durability.waits:  # writes go where a WAIT follows them
            return [*self._send_raw(ops), *self._send([], reads)]
        pipe = self.client.pipeline(transaction=False)
        for op in ops:
            pipe.execute_command(*self._command(op))
        reads(pipe)
        return list(pipe.execute(raise_on_error=False))

    def _command(self, op: Op) -> tuple[Any, ...]:
        if op.kind == "cmd":
            return tuple(op.args)
        if op.kind == "wait":
            return ("WAIT", self.durability.replicas, self.durability.timeout_ms)
        if op.kind == "xadd":
            return ("XADD", op.keys[0], "MAXLEN", "~", EVENT_STREAM_CAP, "*", *op.args)
        sha = self.scripts.by_name[op.kind].sha
        args = op.args if op.late_at is None else self.lateness.args(op)
        return ("EVALSHA", sha, len(op.keys), *op.keys, *args)

    def _send_raw(self, ops: Sequence[Op]) -> list[Any]:
        """The hot path: the commands packed into one write on this thread's own
        connection to each node concerned (one on a single primary), the replies read in
        order."""
        by_node: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            by_node.setdefault(self.topology.node_of(op.key), []).append(i)
        if len(by_node) <= 1:
            return self._send_conn(self._conn(next(iter(by_node), "")), ops)
        out: list[Any] = [None] * len(ops)
        for node, idx in by_node.items():
            replies = self._send_conn(self._conn(node), [ops[i] for i in idx])
            for i, reply in zip(idx, replies, strict=True):
                out[i] = reply
        return out

    def _send_conn(self, conn: ThreadConn, ops: Sequence[Op]) -> list[Any]:
        """``ops`` packed into one write on ``conn``, the replies read in order.
        (redis-py's Pipeline and pool bookkeeping cost more than the round trip itself at
        this size.) With replicated durability a WAIT follows the ops, and
        NotReplicatedError is raised when too few replicas acknowledged them."""
        sent = [*ops, _WAIT] if ops and self.durability.waits else list(ops)
        try:
            self.topology.ready(conn.conn)
            conn.conn.send_packed_command(pack([self._command(op) for op in sent]))
            out = [read_reply(conn.conn) for _ in sent]
        except BaseException as exc:  # a half-read connection must not be reused as is
            tag_node(exc, conn.node)  # the breaker opens for this node only
            conn.drop()
            raise
        if len(sent) > len(ops) and not self._replicated(out[-1]):
            raise not_replicated(out[-1], self.durability, conn.node)
        return out[: len(ops)]

    def _replicated(self, wait_reply: Any) -> bool:
        return isinstance(wait_reply, int) and wait_reply >= self.durability.replicas

    def _acknowledge(self, ops: Sequence[Op], replies: Sequence[Any]) -> None:
        """Settle the bookkeeping of sent ops; failed ones go back to the queue (after a
        script reload if the server lost its scripts, a slot refresh after MOVED), up to
        MAX_ATTEMPTS. Ops that a failed WAIT covers (on the primary, maybe not on a
        replica) go back as they are."""
        failed = []
        unreplicated: set[int] = set()
        start = 0
        for i, (op, res) in enumerate(zip(ops, replies, strict=True)):
            if op is _WAIT:
                if not self._replicated(res):
                    unreplicated.update(range(start, i))
                start = i + 1
        for i, (op, res) in enumerate(zip(ops, replies, strict=True)):
            if op is _WAIT:
                continue
            if i in unreplicated:
                failed.append(op)
            elif isinstance(res, Exception):
                if isinstance(res, MOVED):
                    self.topology.refresh()
                if isinstance(res, redis.exceptions.NoScriptError):
                    self.scripts.load()
                op.attempts += 1
                if op.attempts < MAX_ATTEMPTS:
                    failed.append(op)
            else:
                if op.on_reply is not None:
                    op.on_reply(res)
                if op.reservation_id:
                    self.untrack(op.reservation_id)
        if failed:
            self._requeue(failed)

    def _conn(self, node: str = "") -> ThreadConn:
        """This thread's connection to ``node`` (see Wires.node_of)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.conns, local.pid = ThreadConns(), os.getpid()
            with self._conns_lock:
                self._thread_conns.add(local.conns)
        conns: ThreadConns = local.conns
        conn = conns.by_node.get(node)
        if conn is None:
            raw = self.topology.connection(node)
            if self.hot_timeout_s is not None:
                set_timeouts(raw, self.hot_timeout_s)
            conn = conns.by_node[node] = ThreadConn(raw, node)
        return conn

    def close(self) -> None:
        """Disconnect every thread's connections (a later round trip reconnects)."""
        with self._conns_lock:
            every = list(self._thread_conns)
        for conns in every:
            conns.close()

    def _forget_parent_locked(self) -> None:
        """In a forked child, the parent's batches in flight are not ours (called with
        ``_lock`` held)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._open_batches.clear()

    def _take_pending(self, along: Sequence[Op]) -> tuple[list[Op], int, int]:
        """The queued writes (for the nodes of ``along`` if any), their batch number (0
        if none; registered as in flight in the same step), the last batch number."""
        with self._lock:
            self._forget_parent_locked()
            ops, self._pending = queued_for_nodes(self.topology, self._pending, along)
            if ops:
                self._batch_seq += 1
                self._open_batches.add(self._batch_seq)
            return ops, self._batch_seq if ops else 0, self._batch_seq

    def _requeue(self, ops: list[Op]) -> None:
        if ops:
            with self._lock:
                self._pending[:0] = ops
