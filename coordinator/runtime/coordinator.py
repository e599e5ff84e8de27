"""Coordinator: one Redis connection with its scripts, the token keys, and the process's
background work (the stop listener, local deadline timers, write-behind flushes and
lease renewals)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from ..core.keys import KeySpace, validate_tenant
from ..core.token_codec import TokenCodec, parse_keys
from ..store.topology import Client, Durability, client_from_url
from ..store.tree import Store
from ..store.views import Views
from .settings import DEFAULT_LEASE_MS, DEFAULT_RETENTION_S, FLUSH_AFTER_S, default_url
from .timers import Timers

if TYPE_CHECKING:
    from ..context.execution import ExecutionContext

log = logging.getLogger("coordinator")

class Coordinator:
    """A Redis connection with the scripts loaded, the token keys and the stop listener.

    Use :meth:`from_url`, or :meth:`default` for the process-wide one built from
    ``BUDGET_REDIS_URL`` / ``REDIS_URL`` / ``redis://localhost:6379/0``.
    """

    _default: Coordinator | None = None
    _default_lock = threading.Lock()

    def __init__(
        self,
        client: Client,
        *,
        tenant: str = "",
        token_keys: dict[str, bytes] | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        retention_s: int = DEFAULT_RETENTION_S,
        fail_open: bool = False,
        durability: str = "local",
        replicas: int = 1,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.client = client
        self.keyspace = KeySpace(validate_tenant(tenant))
        self.tenant = tenant
        self.store = Store(client, self.keyspace, lease_ms)
        self.store.durability = Durability(durability, replicas, wait_timeout_ms)
        self.views = Views(client, self.keyspace)
        self.retention_s = retention_s
        self.fail_open = fail_open
        """Opt-in: when Redis is unreachable, run calls without a budget instead of
        halting them. Off by default (fail closed)."""
        self._token_keys = token_keys
        self._codec: TokenCodec | None = None
        self._contexts: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._timers: Timers | None = None
        self._listener: threading.Thread | None = None
        self._closed = False
        self._clock_offset_ms = 0.0  # Redis time - local time, refreshed on every reserve
        self._flush_scheduled = False

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Coordinator:
        """Connect to ``url``: ``redis://``, ``rediss://`` for TLS, ``user:pass@`` for ACL
        users, ``redis+sentinel://s1:26379,s2:26379/<service>`` for Sentinel,
        ``redis+cluster://h1:p1,h2:p2`` (or a node's URL) for Redis Cluster (see
        coordinator/store/topology.py). Unless given here, durability comes from
        ``BUDGET_DURABILITY`` (``local`` or ``replicated``), token keys from
        ``BUDGET_TOKEN_KEYS``, the tenant from ``BUDGET_TENANT``, the lease from
        ``BUDGET_LEASE_MS`` and the retention of closed trees from
        ``BUDGET_RETENTION_S``."""
        client = client_from_url(url)
        if "durability" not in kwargs and os.environ.get("BUDGET_DURABILITY"):
            kwargs["durability"] = os.environ["BUDGET_DURABILITY"]
        if "token_keys" not in kwargs and os.environ.get("BUDGET_TOKEN_KEYS"):
            kwargs["token_keys"] = parse_keys(os.environ["BUDGET_TOKEN_KEYS"])
        kwargs.setdefault("tenant", os.environ.get("BUDGET_TENANT", ""))
        for env, name in (("BUDGET_LEASE_MS", "lease_ms"), ("BUDGET_RETENTION_S", "retention_s")):
            if name not in kwargs and os.environ.get(env):
                kwargs[name] = int(os.environ[env])
        return cls(client, **kwargs)

    @classmethod
    def default(cls) -> Coordinator:
        """The process-wide coordinator (rebuilt in a forked child)."""
        current = cls._default
        if current is not None and current._pid == os.getpid():
            return current
        with cls._default_lock:
            if cls._default is None or cls._default._pid != os.getpid():
                cls._default = cls.from_url(default_url())
            return cls._default

    @classmethod
    def set_default(cls, coordinator: Coordinator | None) -> None:
        """Make ``coordinator`` the process-wide default (None resets it)."""
        with cls._default_lock:
            cls._default = coordinator

    # -- tokens --------------------------------------------------------------------------

    @property
    def codec(self) -> TokenCodec:
        """The token codec. Without configured keys, a development key shared through
        this Redis (``<prefix>:token-dev-key``) is used: anyone who can read this Redis
        can mint tokens with it, so configure ``BUDGET_TOKEN_KEYS`` in production."""
        if self._codec is None:
            keys = self._token_keys
            if not keys:
                name = f"{self.keyspace.prefix}:token-dev-key"
                self.client.set(name, secrets.token_hex(32), nx=True)
                keys = {"dev": str(self.client.get(name)).encode()}
                log.warning("BUDGET_TOKEN_KEYS is not set: signing context tokens with a "
                            "development key kept in Redis (%s); not for production", name)
            self._codec = TokenCodec(keys)
        return self._codec

    def redis_now_ms(self) -> float:
        """The current Redis time, estimated from the last offset measured."""
        return time.time() * 1000 + self._clock_offset_ms

    def observe_redis_time(self, redis_ms: int) -> None:
        self._clock_offset_ms = redis_ms - time.time() * 1000

    # -- local contexts and background work ----------------------------------------------

    def register(self, ctx: ExecutionContext) -> None:
        """Track a local handle so that stops broadcast from anywhere reach it."""
        self._ensure_threads()
        with self._lock:
            self._contexts.add(ctx)

    def unregister(self, ctx: ExecutionContext) -> None:
        with self._lock:
            self._contexts.discard(ctx)

    def call_at_redis_ms(self, redis_ms: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the background when Redis time reaches ``redis_ms``."""
        self._ensure_threads()
        delay = (redis_ms - self.redis_now_ms()) / 1000
        assert self._timers is not None
        self._timers.call_at(time.monotonic() + max(0.0, delay), fn)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self._ensure_threads()
        assert self._timers is not None
        self._timers.call_at(time.monotonic() + delay_s, fn)

    def schedule_flush(self) -> None:
        """Make sure queued writes are sent within FLUSH_AFTER_S."""
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        self.call_later(FLUSH_AFTER_S, self._flush_in_background)

    def _flush_in_background(self) -> None:
        self._flush_scheduled = False
        try:
            self.store.flush()
        except redis.RedisError as exc:
            log.warning("write-behind flush failed, retrying: %s", exc)
            self._flush_scheduled = True
            self.call_later(0.5, self._flush_in_background)

    def _renew_leases(self) -> None:
        if self._closed:
            return
        try:
            self.store.renew_leases()
        except redis.RedisError as exc:
            log.warning("lease renewal failed: %s", exc)
        self.call_later(self.store.lease_ms / 3000, self._renew_leases)

    def _ensure_threads(self) -> None:
        if self._timers is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._timers is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._closed = False
            self._timers = Timers("budget-timers")
            self._listener = threading.Thread(
                target=self._listen, name="budget-stop-listener", daemon=True
            )
            self._listener.start()
            atexit.register(self.close)
        self.call_later(self.store.lease_ms / 3000, self._renew_leases)

    def _listen(self) -> None:
        backoff = 0.1
        while not self._closed:
            pubsub = self.client.pubsub(  # type: ignore[no-untyped-call]
                ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.keyspace.abort_channel)
                self._resync()
                backoff = 0.1
                while not self._closed:
                    msg = pubsub.get_message(timeout=0.5)
                    if msg is not None:
                        self._on_message(msg.get("data"))
            except Exception as exc:  # the listener must outlive any broken connection  # noqa: BLE001
                if not self._closed:
                    log.debug("stop listener reconnecting: %s", exc)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
            finally:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass

    def _on_message(self, data: Any) -> None:
        try:
            msg = json.loads(data)
            root, ctx_id, reason = str(msg["root"]), str(msg["id"]), str(msg["reason"])
        except (TypeError, ValueError, KeyError):
            return
        with self._lock:
            targets = [c for c in self._contexts if c._path.root == root]
        for ctx in targets:
            if ctx_id in ctx._path.ids:
                ctx._on_stop(reason)

    def _resync(self) -> None:
        """After (re)subscribing, read the stop state of every local context: a message
        missed while disconnected loses nothing."""
        with self._lock:
            contexts = list(self._contexts)
        if not contexts:
            return
        pipe = self.client.pipeline(transaction=False)
        for ctx in contexts:
            for cid in ctx._path.ids:
                pipe.hmget(self.keyspace.ctx(ctx._path.root, cid), "status", "reason")
        results = iter(pipe.execute())
        for ctx in contexts:
            for _ in ctx._path.ids:
                status, reason = next(results)
                if status == "stopped":
                    ctx._on_stop(str(reason))

    def close(self) -> None:
        """Flush queued writes and stop the background threads."""
        if self._closed:
            return
        try:
            self.store.flush()
        except redis.RedisError as exc:
            log.warning("could not flush queued writes at exit: %s (their leases will "
                        "expire and charge the estimates)", exc)
        self._closed = True
        if self._timers is not None:
            self._timers.close()
        if self._listener is not None and self._listener is not threading.current_thread():
            try:  # wake the listener from its blocking read
                self.client.publish(self.keyspace.abort_channel, "")
            except redis.RedisError:
                pass
            self._listener.join(timeout=2)
