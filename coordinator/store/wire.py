"""The write-behind wire: sends script calls and commands to Redis in pipelined round trips,
each thread on its own connection, and carries the queued writes (settles, events) along
with the next round trip or the flusher's drain."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.script_constants import EVENT_STREAM_CAP
from .scripts import Scripts

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pure-Python parser: let redis-py pack
    _pack_command = None

MAX_ATTEMPTS = 5
"""How many times a queued write is sent before it is given up (its lease then charges
the estimate)."""


def _pack(commands: list[tuple[Any, ...]]) -> list[bytes]:
    """RESP bytes of several commands, for Connection.send_packed_command."""
    if _pack_command is not None:
        return [b"".join(_pack_command(c) for c in commands)]
    return list(redis.Connection().pack_commands(commands))  # type: ignore[no-untyped-call]


def _read_reply(conn: Any) -> Any:
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        if "OOM command not allowed" in str(exc) and not isinstance(
                exc, redis.exceptions.OutOfMemoryError):
            # Redis before 7 reports a full Redis inside a script as a script error
            return redis.exceptions.OutOfMemoryError(str(exc))
        return exc


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


def command(*args: Any) -> Op:
    """A plain Redis command as an op."""
    return Op("cmd", [], list(args))


class _Conn:
    """One thread's own connection, with the ops sent on it whose replies are unread."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.unacked: list[Op] = []


class Wire:
    """Round trips and write-behind for one Redis client, and the reservations in flight
    (sent by this process and not yet finished) whose leases need renewing."""

    def __init__(self, client: redis.Redis, scripts: Scripts) -> None:
        self.client = client
        self.scripts = scripts
        self._pending: list[Op] = []
        self._lock = threading.Lock()
        self._inflight: dict[str, str] = {}  # reservation id -> root, for lease renewal
        self._local = threading.local()
        self._conns: list[_Conn] = []
        # Batches of queued writes taken off the queue and not yet landed, by number: a
        # read waits for those taken before it (read-your-writes).
        self._batch_seq = 0
        self._open_batches: set[int] = set()
        self._landed = threading.Condition()
        self._conns_pid = os.getpid()

    # -- reservations in flight ----------------------------------------------------------

    def track(self, reservation_id: str, root: str) -> None:
        """A reservation now held in ``root``'s tree: renew its lease until it finishes."""
        self._inflight[reservation_id] = root

    def untrack(self, reservation_id: str) -> None:
        self._inflight.pop(reservation_id, None)

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

    def send_behind(self, op: Op) -> None:
        """Write-behind: send ``op`` now on this thread's connection and read its reply
        later (with the thread's next round trip, or the flusher's drain). Redis runs it
        while the caller goes on."""
        conn = self._conn()
        with conn.lock:
            try:
                conn.conn.send_packed_command(_pack([self._command(op)]))
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.conn.disconnect()
                owed, conn.unacked = conn.unacked, []
                self._requeue([*owed, op])
                return
            conn.unacked.append(op)

    def flush(self) -> None:
        """Make every write-behind op land: read the replies owed on every connection,
        wait for the queued writes other threads are sending, and send what is queued.
        Raises if Redis is unreachable; the writes stay queued."""
        self._send_queued([], None, after_earlier=True)

    # -- read-your-writes ----------------------------------------------------------------

    def _send_queued(self, ops: Sequence[Op], reads: Callable[[Any], None] | None, *,
                     after_earlier: bool) -> list[Any]:
        """:meth:`round_trip`; with ``after_earlier``, every write this process made
        before the call lands first: the replies owed on each of its connections are
        read, and the batches of queued writes that other threads (the flusher) took off
        the queue before this call took its own are sent."""
        if after_earlier:
            with self._lock:
                self._forget_parent_locked()
                conns = list(self._conns)
            self._drain(conns)
        pending, batch, taken_at = self._take_pending()
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
                   if isinstance(r, redis.exceptions.NoScriptError)]
        if not missing:
            return results
        self.scripts.load()
        again = self._send([ops[i] for i in missing], reads)
        for j, i in enumerate(missing):
            results[i] = again[j]
        return results[: len(ops)] + again[len(missing):]

    def _send(self, ops: Sequence[Op], reads: Callable[[Any], None] | None) -> list[Any]:
        if reads is None:
            return self._send_raw(ops)
        pipe = self.client.pipeline(transaction=False)
        for op in ops:
            pipe.execute_command(*self._command(op))  # type: ignore[no-untyped-call]
        reads(pipe)
        return list(pipe.execute(raise_on_error=False))

    def _command(self, op: Op) -> tuple[Any, ...]:
        if op.kind == "cmd":
            return tuple(op.args)
        if op.kind == "xadd":
            return ("XADD", op.keys[0], "MAXLEN", "~", EVENT_STREAM_CAP, "*", *op.args)
        sha = self.scripts.by_name[op.kind].sha
        return ("EVALSHA", sha, len(op.keys), *op.keys, *op.args)

    def _send_raw(self, ops: Sequence[Op]) -> list[Any]:
        """The hot path: the commands packed into one write on this thread's own
        connection, the replies read in order. Replies still owed to earlier write-behind
        sends on that connection are read first and acknowledged. (redis-py's Pipeline and
        pool bookkeeping cost more than the round trip itself at this size.)"""
        conn = self._conn()
        with conn.lock:
            earlier, conn.unacked = conn.unacked, []
            try:
                conn.conn.send_packed_command(_pack([self._command(op) for op in ops]))
                acks = [_read_reply(conn.conn) for _ in earlier]
                out = [_read_reply(conn.conn) for _ in ops]
            except BaseException:
                conn.conn.disconnect()  # a half-read connection must not be reused as is
                self._requeue(earlier)  # they may or may not have run: all idempotent
                raise
            # under the lock: a reader draining this connection finds them acknowledged
            # (a failed one back in the queue) once it gets the lock
            self._acknowledge(earlier, acks)
        return out

    def _drain(self, conns: Sequence[_Conn]) -> None:
        """Read the replies owed on ``conns`` and acknowledge them."""
        for conn in conns:
            if not conn.unacked:
                continue
            with conn.lock:
                owed, conn.unacked = conn.unacked, []
                try:
                    acks = [_read_reply(conn.conn) for _ in owed]
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    conn.conn.disconnect()
                    self._requeue(owed)
                    continue
                # under the lock: a reader draining this connection finds them
                # acknowledged (a failed one back in the queue) once it gets the lock
                self._acknowledge(owed, acks)

    def _acknowledge(self, ops: Sequence[Op], replies: Sequence[Any]) -> None:
        """Settle the bookkeeping of sent ops; failed ones go back to the queue (after a
        script reload if the server lost its scripts), up to MAX_ATTEMPTS."""
        failed = []
        for op, res in zip(ops, replies, strict=True):
            if isinstance(res, Exception):
                if isinstance(res, redis.exceptions.NoScriptError):
                    self.scripts.load()
                op.attempts += 1
                if op.attempts < MAX_ATTEMPTS:
                    failed.append(op)
            elif op.reservation_id:
                self._inflight.pop(op.reservation_id, None)
        if failed:
            self._requeue(failed)

    def _conn(self) -> _Conn:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.conn = _Conn(self.client.connection_pool.make_connection())
            local.pid = os.getpid()
            with self._lock:
                self._forget_parent_locked()
                self._conns.append(local.conn)
        conn: _Conn = local.conn
        return conn

    def _forget_parent_locked(self) -> None:
        """In a forked child, the parent's connections and batches are not ours (called
        with ``_lock`` held)."""
        if self._conns_pid != os.getpid():
            self._conns, self._conns_pid = [], os.getpid()
            self._open_batches.clear()

    def _take_pending(self) -> tuple[list[Op], int, int]:
        """The queued writes, the number of their batch (0 when there are none),
        registered as in flight in the same step, and the last batch number taken."""
        with self._lock:
            self._forget_parent_locked()
            ops, self._pending = self._pending, []
            if ops:
                self._batch_seq += 1
                self._open_batches.add(self._batch_seq)
            return ops, self._batch_seq if ops else 0, self._batch_seq

    def _requeue(self, ops: list[Op]) -> None:
        if ops:
            with self._lock:
                self._pending[:0] = ops
