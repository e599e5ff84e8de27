"""One page of active execution sessions for the dashboard, read from the sessions'
indexes (the tenants set and each tenant's expiry zset; never a keyspace scan)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.session_models import ExecutionSession
from .dashboard_reads import redis_ms
from .sessions import SessionKeys, SessionStore, decode

MAX_TENANTS = 200
"""Session tenants a page spans at most (one ZCARD each); the rest are reported cut."""


@dataclass(frozen=True)
class SessionsPage:
    """Active sessions from ``offset`` (tenants in name order, each soonest to expire
    first), the total active, and whether tenants beyond MAX_TENANTS were left out."""

    now_ms: int
    total: int
    sessions: list[ExecutionSession]
    tenants_cut: bool


def active_page(store: SessionStore, offset: int, limit: int) -> SessionsPage:
    """At most ``limit`` active sessions of the store's tenants from ``offset``.

    Redis work: the tenants set (only for a store serving every tenant), one ZCARD per
    tenant, one ZRANGE per tenant the page touches and one HGETALL per row: bounded by
    the page size and the tenant count, not by the sessions stored. Redis errors are
    raised as they are (the dashboard answers 503)."""
    client = store.client
    if store.tenant:
        tenants = [store.tenant]
    else:
        tenants = sorted(str(t) for t in client.smembers(store.tenants_key))
    cut = len(tenants) > MAX_TENANTS
    keys = [SessionKeys(store.prefix, t) for t in tenants[:MAX_TENANTS]]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for k in keys:
        pipe.zcard(k.expiry)
    reply = pipe.execute()
    now_ms, counts = redis_ms(reply[0]), [int(n) for n in reply[1:]]
    spans: list[tuple[SessionKeys, int, int]] = []
    start, want = offset, limit
    for k, n in zip(keys, counts, strict=True):
        if want <= 0:
            break
        if start >= n:
            start -= n
            continue
        take = min(want, n - start)
        spans.append((k, start, start + take - 1))
        want -= take
        start = 0
    sessions: list[ExecutionSession] = []
    if spans:
        pipe = client.pipeline(transaction=False)
        for k, lo, hi in spans:
            pipe.zrange(k.expiry, lo, hi)
        members = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for (k, _, _), names in zip(spans, members, strict=True):
            for m in names:
                pipe.hgetall(k.record(str(m)))
        for h in pipe.execute():
            session = decode([x for kv in dict(h or {}).items() for x in kv])
            if session is not None:  # a record gone since the range: skipped
                sessions.append(session)
    return SessionsPage(now_ms, sum(counts), sessions, cut)
