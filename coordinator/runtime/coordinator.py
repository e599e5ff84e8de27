"""Coordinator: wires one Redis connection to the store, the views, the token codec and
the process's background work (timers, flusher, lease renewal, stop listener)."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.charging_rules import ChargingPolicy
from ..core.keys import KeySpace, validate_tenant
from ..core.paths import Path, stored_ids
from ..core.redaction import redact_url
from ..core.token_codec import TokenCodec, parse_keys
from ..errors import ContextNotFoundError
from ..models import TokenBudget
from ..models_limits import LimitsChange, LimitsRequest
from ..store.channels import StopSubscription, wake
from ..store.connection import Client, connect, describe_client, shared_dev_key
from ..store.errors import RedisError
from ..store.health import probe
from ..store.io_thread import IOThread
from ..store.limits import set_limits
from ..store.repair import Repaired, repair_context
from ..store.topology import Durability
from ..store.tree import Store
from ..store.views import Views
from ..store.warnings_read import read_warnings
from .actor import user_at_host
from .backend_health import BackendHealth
from .flusher import Flusher
from .leases import LeaseRenewer
from .settings import (
    DEFAULT_HOT_TIMEOUT_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_LONG_TIMEOUT_MS,
    DEFAULT_PROBE_INTERVAL_MS,
    DEFAULT_RETENTION_S,
    checked_setting,
    default_url,
)
from .stop_listener import StopListener, StopTarget
from .timers import Timers

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
        charging: ChargingPolicy | None = None,
        hot_timeout_ms: int = DEFAULT_HOT_TIMEOUT_MS,
        probe_interval_ms: int = DEFAULT_PROBE_INTERVAL_MS,
        durability: str = "local",
        replicas: int = 1,
        wait_timeout_ms: int = 1000,
        long_timeout_ms: int = DEFAULT_LONG_TIMEOUT_MS,
    ) -> None:
        lease_ms, retention_s, hot_timeout_ms, probe_interval_ms, long_timeout_ms = (
            checked_setting(name, value) for name, value in (
                ("lease_ms", lease_ms), ("retention_s", retention_s),
                ("hot_timeout_ms", hot_timeout_ms), ("probe_interval_ms", probe_interval_ms),
                ("long_timeout_ms", long_timeout_ms)))
        self.client = client
        self.long_timeout_ms = long_timeout_ms
        """The client's reply timeout (``from_url`` sets it): what a blocking wait for a
        long operation (an open off the event loop's thread) is bounded by."""
        self.keyspace = KeySpace(validate_tenant(tenant))
        self.tenant = tenant
        self.store = Store(client, self.keyspace, lease_ms)
        self.store.wire.durability = Durability(durability, replicas, wait_timeout_ms)
        hot_s = hot_timeout_ms / 1000
        self.hot_timeout_ms = hot_timeout_ms
        self.store.wire.hot_timeout_s = hot_s
        wires = self.store.wire.topology
        self.backend = BackendHealth(lambda node: probe(wires, node, hot_s),
                                     probe_interval_ms / 1000, wires.node_of)
        """The backend breaker, per node: once a node is known down, the calls it serves
        fail closed at once until a probe finds it answering again (or, on a Cluster,
        its slots served by a new primary)."""
        self.io = IOThread(self.store, self.backend.allow, self.backend.failed,
                           self.backend.succeeded)
        """Runs the Redis work of async calls off their event loop."""
        self.views = Views(client, self.keyspace)
        self.retention_s = retention_s
        self.fail_open = fail_open
        self.charging = charging or ChargingPolicy()
        """How calls whose spend is not known are charged (docs/tokens.md)."""
        """Opt-in: when Redis is unreachable, run calls without a budget instead of
        halting them. Off by default (fail closed)."""
        self._token_keys = token_keys
        self._codec: TokenCodec | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._timers: Timers | None = None
        self._listener: StopListener | None = None
        self._closed = False
        self._owns_client = False  # from_url made the client: close() closes it
        self._clock_offset_ms = 0.0  # Redis time - local time, refreshed on every reserve
        self._flusher = Flusher(self.store.flush, self.call_later)
        self.shown_url = describe_client(client)
        """Where this coordinator's Redis is, its password replaced by ``**``."""

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, *, long_timeout_ms: int | None = None,
                 **kwargs: Any) -> Coordinator:
        """Connect to ``url``: ``redis://``, ``rediss://`` for TLS, ``user:pass@`` for ACL
        users, ``redis+sentinel://s1:26379,s2:26379/<service>`` for Sentinel,
        ``redis+cluster://h1:p1,h2:p2`` (or a node's URL) for Redis Cluster (see
        coordinator/store/topology.py). Unless given here, durability comes from
        ``BUDGET_DURABILITY`` (``local`` or ``replicated``) and ``BUDGET_REPLICAS`` (how
        many replicas ``replicated`` waits for), token keys from
        ``BUDGET_TOKEN_KEYS``, the tenant from ``BUDGET_TENANT``, the lease from
        ``BUDGET_LEASE_MS``, the retention of closed trees from ``BUDGET_RETENTION_S``,
        and the timeouts from ``BUDGET_HOT_TIMEOUT_MS``, ``BUDGET_LONG_TIMEOUT_MS`` and
        ``BUDGET_PROBE_INTERVAL_MS`` (see runtime/settings.py for their defaults)."""
        if long_timeout_ms is None:
            env = os.environ.get("BUDGET_LONG_TIMEOUT_MS")
            long_timeout_ms = (checked_setting("long_timeout_ms", env, "BUDGET_LONG_TIMEOUT_MS")
                               if env else DEFAULT_LONG_TIMEOUT_MS)
        long_timeout_ms = checked_setting("long_timeout_ms", long_timeout_ms)
        client = connect(url, socket_timeout=long_timeout_ms / 1000)
        if "durability" not in kwargs and os.environ.get("BUDGET_DURABILITY"):
            kwargs["durability"] = os.environ["BUDGET_DURABILITY"]
        if "token_keys" not in kwargs and os.environ.get("BUDGET_TOKEN_KEYS"):
            kwargs["token_keys"] = parse_keys(os.environ["BUDGET_TOKEN_KEYS"])
        kwargs.setdefault("tenant", os.environ.get("BUDGET_TENANT", ""))
        for env, name in (("BUDGET_LEASE_MS", "lease_ms"), ("BUDGET_RETENTION_S", "retention_s"),
                          ("BUDGET_REPLICAS", "replicas"),
                          ("BUDGET_HOT_TIMEOUT_MS", "hot_timeout_ms"),
                          ("BUDGET_PROBE_INTERVAL_MS", "probe_interval_ms")):
            if name not in kwargs and os.environ.get(env):
                kwargs[name] = checked_setting(name, os.environ[env], env)
        coord = cls(client, long_timeout_ms=long_timeout_ms, **kwargs)
        coord._owns_client = True
        coord.shown_url = redact_url(url)
        return coord

    def __repr__(self) -> str:
        return (f"Coordinator({self.shown_url!r}, tenant={self.tenant!r}, "
                f"durability={self.store.wire.durability.mode!r})")

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

    def token_codec(self) -> TokenCodec:
        """The token codec, built on first use from the configured keys, else by
        :meth:`provision_token_keys` (which writes to Redis)."""
        if self._codec is None:
            self._codec = TokenCodec(self._token_keys or self.provision_token_keys())
        return self._codec

    @property
    def signing_kid(self) -> str:
        """The key id tokens are (or will be) signed with, without reading Redis."""
        if self._codec is not None:
            return self._codec.signing_kid
        return next(iter(self._token_keys)) if self._token_keys else "dev"

    def provision_token_keys(self) -> dict[str, bytes]:
        """The development key shared through this Redis (``<prefix>:token-dev-key``,
        created by the first process that asks): the signing key when no keys are
        configured; one process per Redis and hour warns that it is in use. Anyone who
        can read this Redis can mint tokens with it, so configure ``BUDGET_TOKEN_KEYS`` in
        production."""
        name = f"{self.keyspace.prefix}:token-dev-key"
        key, announce = shared_dev_key(self.client, name)
        (log.warning if announce else log.debug)(
            "BUDGET_TOKEN_KEYS is not set: context tokens are signed with a development "
            "key kept in Redis (%s), not for production (said once an hour per Redis)", name)
        return {"dev": key}

    def repair(self, chain_id: str, operator: str = "the API") -> Repaired:
        """Re-validate a context after its corrupt fields were fixed or reset, lift its
        ``state_corrupt`` stop, and charge once what the corruption left held (docs/
        topology.md, "Repairing corrupt state"). Raises ``CorruptStateError`` while a
        number is still corrupt, ``ContextNotFoundError`` for an unknown id."""
        return repair_context(self.store, self._stored_path(chain_id), operator)

    def set_limits(self, ctx_id: str, *, max_cost_usd: float | None = None,
                   max_steps: int | None = None, max_retries_total: int | None = None,
                   token_budget: TokenBudget | None = None, actor: str | None = None,
                   reason: str | None = None) -> LimitsChange:
        """Change the limits of the running context ``ctx_id``, from any process, in one
        atomic step audited by a ``limits_changed`` event (docs/operators.md). A raise
        lifts the stop that limit caused (the context and its subtree run again, in every
        process); a limit at or below what is spent stops the context. Raises
        InvalidConfigError for a bad value (before Redis is asked), ContextNotFoundError,
        ContextClosedError or CorruptStateError; nothing changes then."""
        asked = LimitsRequest(max_cost_usd=max_cost_usd, max_steps=max_steps,
                              max_retries_total=max_retries_total, token_budget=token_budget,
                              actor=user_at_host() if actor is None else actor,
                              reason="" if reason is None else reason)
        path = self._stored_path(ctx_id)
        done = set_limits(self.store, path, asked)
        if done.lifted and self._listener is not None:  # this process hears it at once
            self._listener.lifted(path.root, ctx_id, done.lifted)
        return done

    def _stored_path(self, chain_id: str) -> Path:
        """Where the context ``chain_id`` sits, as its hash records it."""
        root = self.views.locate(chain_id)
        h = self.views.read_contexts([(root, chain_id)])[0] if root else {}
        if root is None or not h:
            raise ContextNotFoundError(chain_id)
        return Path(root, stored_ids(h, root, chain_id))

    # -- Redis time ----------------------------------------------------------------------

    def redis_now_ms(self) -> float:
        """The current Redis time, estimated from the last offset measured."""
        return time.time() * 1000 + self._clock_offset_ms

    def observe_redis_time(self, redis_ms: int) -> None:
        self._clock_offset_ms = redis_ms - time.time() * 1000

    # -- local contexts and background work ----------------------------------------------

    def register(self, ctx: StopTarget) -> None:
        """Track a local handle so that stops broadcast from anywhere reach it."""
        listener = self._ensure_threads()
        listener.add(ctx)

    def unregister(self, ctx: StopTarget) -> None:
        if self._listener is not None:
            self._listener.discard(ctx)

    def call_at_redis_ms(self, redis_ms: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the background when Redis time reaches ``redis_ms``."""
        delay = (redis_ms - self.redis_now_ms()) / 1000
        self.call_later(max(0.0, delay), fn)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self._ensure_threads()
        assert self._timers is not None
        self._timers.call_at(time.monotonic() + delay_s, fn)

    def schedule_flush(self) -> None:
        """Make sure queued writes are sent soon (see :class:`Flusher`)."""
        self._flusher.schedule()

    def _ensure_threads(self) -> StopListener:
        listener = self._listener
        if listener is not None and self._timers is not None and self._pid == os.getpid():
            return listener
        with self._lock:
            if (self._listener is not None and self._timers is not None
                    and self._pid == os.getpid()):
                return self._listener
            self._pid = os.getpid()
            self._closed = False
            self._timers = Timers("budget-timers")
            previous = self._listener
            listener = StopListener(
                lambda: StopSubscription(self.client, self.keyspace.abort_channel),
                self.store.read_stops, lambda paths: read_warnings(self.store, paths))
            if previous is not None:  # forked: the parent's handles are ours too
                for target in previous._targets_now():
                    listener.add(target)
            self._listener = listener
            listener.start()
            atexit.register(self.close)
        LeaseRenewer(self._renew_leases, self.store.lease_ms, self.call_later,
                     lambda: self._closed).start()
        return listener

    def _renew_leases(self) -> None:
        if self.backend.allow():  # while Redis is down, do not hold the timers a timeout
            self.store.renew_leases()

    def close(self) -> None:
        """Flush queued writes, stop the background threads and disconnect (the client
        too when ``from_url`` made it; a later call reconnects)."""
        if self._closed:
            return
        try:
            self.store.flush()
        except RedisError as exc:
            log.warning("could not flush queued writes at exit: %s (their leases will "
                        "expire and charge the estimates)", exc)
        self._closed = True
        self.io.close()
        self.backend.close()
        if self._timers is not None:
            self._timers.close()
        if self._listener is not None:
            self._listener.stop(lambda: wake(self.client, self.keyspace.abort_channel))
        self.store.wire.close()
        if self._owns_client:
            self.client.close()
