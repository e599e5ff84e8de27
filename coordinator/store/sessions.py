"""SessionStore: execution session records in Redis. Every Redis command of sessions is
here; every state change is one atomic script (lua/session_*.lua).

Layout (``P`` is the coordinator's key prefix, ``T`` the tenant; the hash tag
``{sess:T}`` puts a tenant's keys on one Redis Cluster slot, so each script is
slot-safe)::

    P:{sess:T}:rec:<conversation>:<path>   hash    the record (kept after termination)
    P:{sess:T}:active                      set     active members "<conversation>:<path>"
    P:{sess:T}:expiry                      zset    active members by expires_at (ms)
    P:{sess:T}:claims                      zset    creations in flight by claim deadline
    P:{sess:T}:claimers                    hash    member -> claim id
    P:{sess:T}:history                     stream  records replaced by a newer session
    P:sess:tenants                         set     tenants with sessions (a cross-slot
                                                   view, written outside the scripts)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Protocol, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from ..core.contracts import (
    CONTRACTS,
    SESSION_ABANDON,
    SESSION_ACQUIRE,
    SESSION_COMMIT,
    SESSION_LIST,
    SESSION_LOAD,
    SESSION_RECORD,
    SESSION_SAVE,
    SESSION_TERMINATE,
    Contract,
)
from ..core.keys import KeySpace
from ..core.session_errors import SessionStoreUnavailableError, SessionTenantError
from ..core.session_models import ExecutionSession, ExecutionSessionIdentity
from .scripts import script_source
from .topology import Client

HISTORY_CAP = 10_000
LIST_LIMIT = 10_000
SCRIPT_NAMES = tuple(dict.fromkeys(c.script for c in CONTRACTS
                                   if c.script.startswith("session_")))
_INT_FIELDS = ("execution_count", "total_execution_time_ms", "ttl_ms", "generation")
_TIME_FIELDS = ("created_at", "last_used_at", "expires_at", "updated_at")
T = TypeVar("T")


class _OnRedis(Protocol):
    """What the store reads of a Coordinator (the runtime layer, which imports this one)."""

    client: Client
    keyspace: KeySpace
    tenant: str


def to_ms(when: datetime) -> int:
    """A timezone-aware datetime as epoch milliseconds."""
    return int(when.timestamp() * 1000)


def from_ms(ms: int | str) -> datetime:
    """Epoch milliseconds as a UTC datetime."""
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class Acquired:
    """What session_acquire decided (see lua/session_acquire.lua)."""

    kind: Literal["existing", "wait", "cap", "claimed"]
    now_ms: int
    retired_sandbox: str
    """Sandbox of a session retired just now (expired or rotated): kill it."""
    count: int
    """cap: the tenant's active + claims; wait: the other claim's deadline."""
    session: ExecutionSession | None


@dataclass(frozen=True)
class Terminated:
    """What session_terminate did."""

    kind: Literal["ok", "inactive", "missing", "mismatch"]
    now_ms: int
    sandbox_id: str


@dataclass(frozen=True)
class Recorded:
    """A counted execution: the new count and expiry."""

    now_ms: int
    execution_count: int
    expires_at: datetime


def decode(flat: Sequence[Any]) -> ExecutionSession | None:
    """A record from HGETALL's flat field/value list (None when empty)."""
    h = {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}
    if "status" not in h:
        return None
    extra: dict[str, Any] = {"status": h["status"]}
    extra.update({f: from_ms(h.get(f) or 0) for f in _TIME_FIELDS})
    extra.update({f: int(h.get(f) or 0) for f in _INT_FIELDS})
    return ExecutionSession(
        identity=ExecutionSessionIdentity(tenant_id=h["tenant_id"],
                                          conversation_id=h["conversation_id"],
                                          path_id=h["path_id"]),
        sandbox_id=h["sandbox_id"], provider=h.get("provider", ""), host=h.get("host", ""),
        connection=json.loads(h.get("connection") or "{}"),
        last_error=h.get("last_error") or None,
        terminated_reason=h.get("terminated_reason") or None,
        budget_root=h.get("budget_root", ""),
        budget_path=tuple(p for p in h.get("budget_path", "").split(",") if p),
        **extra,
    )


def encode(session: ExecutionSession) -> dict[str, str]:
    """A record as hash fields (times in epoch ms)."""
    i = session.identity
    return {
        "tenant_id": i.tenant_id, "conversation_id": i.conversation_id, "path_id": i.path_id,
        "sandbox_id": session.sandbox_id, "provider": session.provider, "host": session.host,
        "connection": json.dumps(session.connection, sort_keys=True),
        "status": session.status, "last_error": session.last_error or "",
        "terminated_reason": session.terminated_reason or "",
        "budget_root": session.budget_root, "budget_path": ",".join(session.budget_path),
        **{f: str(to_ms(getattr(session, f))) for f in _TIME_FIELDS},
        **{f: str(getattr(session, f)) for f in _INT_FIELDS},
    }


class SessionKeys:
    """Key names of one tenant's sessions (all on the tenant's hash-tag slot)."""

    def __init__(self, prefix: str, tenant_id: str) -> None:
        self._base = f"{prefix}:{{sess:{tenant_id}}}"

    def record(self, member: str) -> str:
        return f"{self._base}:rec:{member}"

    @property
    def active(self) -> str:
        return f"{self._base}:active"

    @property
    def expiry(self) -> str:
        return f"{self._base}:expiry"

    @property
    def claims(self) -> str:
        return f"{self._base}:claims"

    @property
    def claimers(self) -> str:
        return f"{self._base}:claimers"

    @property
    def history(self) -> str:
        return f"{self._base}:history"


class SessionStore:
    """Session records on one Redis. ``tenant`` (a coordinator's tenant) restricts the
    store to that tenant's sessions; '' serves every tenant. Redis failures raise
    :class:`SessionStoreUnavailableError` (fail closed)."""

    def __init__(self, client: Client, *, prefix: str = "bc", tenant: str = "") -> None:
        kwargs = (client.get_connection_kwargs()  # type: ignore[no-untyped-call]
                  if isinstance(client, RedisCluster)
                  else client.connection_pool.connection_kwargs)
        if not kwargs.get("decode_responses"):
            raise ValueError("SessionStore needs a client made with decode_responses=True "
                             "(as Coordinator.from_url makes it)")
        self.client = client
        self.prefix = prefix
        self.tenant = tenant
        self._scripts: dict[str, Script] = {
            name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}
        self._indexed: set[str] = set()

    @classmethod
    def for_coordinator(cls, coordinator: _OnRedis) -> SessionStore:
        """The store on a coordinator's Redis, key prefix and tenant."""
        return cls(coordinator.client, prefix=coordinator.keyspace.prefix,
                   tenant=coordinator.tenant)

    @property
    def tenants_key(self) -> str:
        return f"{self.prefix}:sess:tenants"

    # -- plumbing ------------------------------------------------------------------------

    def _keys(self, identity: ExecutionSessionIdentity) -> SessionKeys:
        if self.tenant and identity.tenant_id != self.tenant:
            raise SessionTenantError(identity.tenant_id, self.tenant)
        return SessionKeys(self.prefix, identity.tenant_id)

    def _run(self, operation: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.RedisError as exc:
            raise SessionStoreUnavailableError(operation, exc) from exc

    def _call(self, contract: Contract, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[contract.script]
        return self._run(contract.script, lambda: script(keys=keys, args=args))

    def _index_tenant(self, tenant_id: str) -> None:
        # Before the first write: a crash after it leaves a tenant listed, never a session
        # unlisted.
        if tenant_id not in self._indexed:
            self._run("index tenant", lambda: self.client.sadd(self.tenants_key, tenant_id))
            self._indexed.add(tenant_id)

    # -- the specification's operations --------------------------------------------------

    def load(self, identity: ExecutionSessionIdentity) -> ExecutionSession | None:
        """The record whatever its status, or None when the path never had a session."""
        return self.load_at(identity)[0]

    def load_at(self, identity: ExecutionSessionIdentity
                ) -> tuple[ExecutionSession | None, int]:
        """The record and the Redis time it was read at (ms)."""
        keys = self._keys(identity)
        reply = self._call(SESSION_LOAD, SESSION_LOAD.key_list(record=keys.record(identity.member)),
                           SESSION_LOAD.arg_list())
        return decode(reply[1:]), int(reply[0])

    def save(self, identity: ExecutionSessionIdentity, session: ExecutionSession) -> int:
        """Upsert the record (indexed by its status); returns updated_at in ms."""
        if session.identity != identity:
            raise ValueError(f"the session belongs to {session.identity}, not {identity}")
        keys = self._keys(identity)
        self._index_tenant(identity.tenant_id)
        fields = [x for fv in encode(session).items() if fv[0] != "updated_at" for x in fv]
        return int(self._call(SESSION_SAVE, SESSION_SAVE.key_list(
            record=keys.record(identity.member), active=keys.active, expiry=keys.expiry),
            SESSION_SAVE.arg_list(member=identity.member, fields=fields)))

    def record_execution(self, identity: ExecutionSessionIdentity, duration_ms: int,
                         *, sandbox_id: str = "") -> Recorded | None:
        """Count one execution and extend expires_at to now + the record's TTL (Redis
        time), atomically. None when there is no record (or, given ``sandbox_id``, the
        record names another sandbox)."""
        keys = self._keys(identity)
        reply = self._call(SESSION_RECORD, SESSION_RECORD.key_list(
            record=keys.record(identity.member), expiry=keys.expiry), SESSION_RECORD.arg_list(
            member=identity.member, duration_ms=max(0, int(duration_ms)), sandbox_id=sandbox_id))
        if reply[0] != "ok":
            return None
        return Recorded(int(reply[1]), int(reply[2]), from_ms(reply[3]))

    def terminate(self, identity: ExecutionSessionIdentity, reason: str, *,
                  status: Literal["terminated", "expired", "error"] = "terminated",
                  last_error: str = "", sandbox_id: str = "",
                  only_if_expired: bool = False) -> Terminated:
        """Mark an active session ``status`` (default terminated) with ``reason``, out of
        the indexes; the record stays for audit. Given ``sandbox_id``, a record naming
        another sandbox is left alone; ``only_if_expired`` leaves one not yet expired."""
        keys = self._keys(identity)
        reply = self._call(SESSION_TERMINATE, SESSION_TERMINATE.key_list(
            record=keys.record(identity.member), active=keys.active, expiry=keys.expiry),
            SESSION_TERMINATE.arg_list(member=identity.member, status=status, reason=reason,
                                       last_error=last_error, sandbox_id=sandbox_id,
                                       only_if_expired=only_if_expired))
        return Terminated(reply[0], int(reply[1]), str(reply[2]) if len(reply) > 2 else "")

    def list_expired(self, cutoff: datetime, *, tenant_id: str | None = None,
                     limit: int = LIST_LIMIT) -> list[ExecutionSessionIdentity]:
        """Active sessions whose expires_at is before ``cutoff`` (every tenant this store
        serves, or ``tenant_id``), from the expiry indexes."""
        tenants = [tenant_id] if tenant_id is not None else self.tenants()
        out: list[ExecutionSessionIdentity] = []
        for tenant in tenants:
            out += self._list(tenant, str(to_ms(cutoff)), limit - len(out))
            if len(out) >= limit:
                break
        return out

    def list_active_for_tenant(self, tenant_id: str, *, limit: int = LIST_LIMIT
                               ) -> list[ExecutionSessionIdentity]:
        """The tenant's active sessions (soonest to expire first)."""
        return self._list(tenant_id, "+inf", limit)

    def _list(self, tenant_id: str, cutoff: str, limit: int
              ) -> list[ExecutionSessionIdentity]:
        probe = ExecutionSessionIdentity(tenant_id=tenant_id, conversation_id="x", path_id="x")
        keys = self._keys(probe)
        reply = self._call(SESSION_LIST, SESSION_LIST.key_list(expiry=keys.expiry),
                           SESSION_LIST.arg_list(cutoff=cutoff, limit=max(0, limit)))
        out = []
        for member in reply[1::2]:
            conversation, _, path = str(member).partition(":")
            out.append(ExecutionSessionIdentity(tenant_id=tenant_id,
                                                conversation_id=conversation, path_id=path))
        return out

    def now_ms(self) -> int:
        """Redis time in ms (the one clock of expiry)."""
        sec, usec = self._run("time", self.client.time)
        return int(sec) * 1000 + int(usec) // 1000

    def tenants(self) -> list[str]:
        """Tenants that have had sessions (this store's own tenant only, if it has one)."""
        if self.tenant:
            return [self.tenant]
        members = self._run("tenants", lambda: self.client.smembers(self.tenants_key))
        return sorted(str(m) for m in members)

    # -- creation (the manager's protocol) -----------------------------------------------

    def acquire(self, identity: ExecutionSessionIdentity, *, cap: int, max_executions: int,
                claim_id: str, claim_ttl_ms: int) -> Acquired:
        """The usable session, or a claim to create one, admitted against ``cap``."""
        keys = self._keys(identity)
        self._index_tenant(identity.tenant_id)
        reply = self._call(SESSION_ACQUIRE, SESSION_ACQUIRE.key_list(
            record=keys.record(identity.member), active=keys.active, expiry=keys.expiry,
            claims=keys.claims, claimers=keys.claimers), SESSION_ACQUIRE.arg_list(
            member=identity.member, cap=cap, max_executions=max_executions, claim_id=claim_id,
            claim_ttl_ms=claim_ttl_ms))
        session = decode(reply[4:]) if reply[0] == "existing" else None
        return Acquired(reply[0], int(reply[1]), str(reply[2]), int(reply[3]), session)

    def commit(self, identity: ExecutionSessionIdentity, *, claim_id: str, ttl_ms: int,
               fields: Mapping[str, str]) -> ExecutionSession | None:
        """Record the session made under ``claim_id`` as active; None when the claim
        lapsed (the caller kills the sandbox it made)."""
        keys = self._keys(identity)
        reply = self._call(SESSION_COMMIT, SESSION_COMMIT.key_list(
            record=keys.record(identity.member), active=keys.active, expiry=keys.expiry,
            claims=keys.claims, claimers=keys.claimers, history=keys.history),
            SESSION_COMMIT.arg_list(member=identity.member, claim_id=claim_id, ttl_ms=ttl_ms,
                                    history_cap=HISTORY_CAP,
                                    fields=[x for fv in fields.items() for x in fv]))
        if reply[0] != "ok":
            return None
        return self.load(identity)

    def abandon(self, identity: ExecutionSessionIdentity, claim_id: str) -> bool:
        """Drop the caller's creation claim (the sandbox could not be made)."""
        keys = self._keys(identity)
        return bool(self._call(SESSION_ABANDON, SESSION_ABANDON.key_list(
            claims=keys.claims, claimers=keys.claimers),
            SESSION_ABANDON.arg_list(member=identity.member, claim_id=claim_id)))

    def history(self, identity: ExecutionSessionIdentity, count: int = 100
                ) -> list[ExecutionSession]:
        """Records of the tenant's replaced sessions, newest first (audit)."""
        keys = self._keys(identity)
        rows: list[Any] = self._run(
            "history", lambda: list(self.client.xrevrange(keys.history, count=count) or []))
        out = []
        for _id, fields in rows:
            flat = [x for kv in dict(fields or {}).items() for x in kv]
            session = decode(flat)
            if session is not None:
                out.append(session)
        return out
