"""SessionStore against a real Redis: the specification's behavioural rules, one by one."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
import redis

from coordinator import Coordinator
from coordinator.errors import InvalidConfigError
from coordinator.sessions import (
    ExecutionSession,
    ExecutionSessionIdentity,
    SessionStore,
    SessionStoreUnavailableError,
    SessionTenantError,
)


def ident(path: str = "p1", tenant: str = "acme", conv: str = "c1") -> ExecutionSessionIdentity:
    return ExecutionSessionIdentity(tenant_id=tenant, conversation_id=conv, path_id=path)


def record(identity: ExecutionSessionIdentity, *, status: str = "active",
           expires_in_s: float = 600, ttl_ms: int = 600_000) -> ExecutionSession:
    now = datetime.now(timezone.utc)
    return ExecutionSession(
        identity=identity, sandbox_id=f"sb-{identity.path_id}", provider="local",
        created_at=now, last_used_at=now, updated_at=now,
        expires_at=now + timedelta(seconds=expires_in_s), status=status, ttl_ms=ttl_ms)


@pytest.fixture
def store(coord: Coordinator) -> SessionStore:
    return SessionStore(coord.client, prefix=coord.keyspace.prefix)


def test_load_returns_none_without_a_record(store: SessionStore) -> None:
    assert store.load(ident()) is None


@pytest.mark.parametrize("status", ["expired", "error", "terminated", "active"])
def test_load_returns_the_record_whatever_its_status(store: SessionStore, status: str) -> None:
    i = ident()
    store.save(i, record(i, status=status))
    got = store.load(i)
    assert got is not None and got.status == status and got.sandbox_id == "sb-p1"
    assert got.identity == i


def test_save_upserts_and_indexes_by_status(store: SessionStore) -> None:
    i = ident()
    store.save(i, record(i))
    assert store.list_active_for_tenant("acme") == [i]
    before = store.load(i)
    assert before is not None
    store.save(i, before.model_copy(update={"status": "error", "last_error": "boom"}))
    after = store.load(i)
    assert after is not None and after.status == "error" and after.last_error == "boom"
    assert after.updated_at >= before.updated_at
    assert store.list_active_for_tenant("acme") == []


def test_record_execution_counts_and_extends_expiry_from_redis_now(
        store: SessionStore) -> None:
    i = ident()
    store.save(i, record(i, expires_in_s=1, ttl_ms=120_000))
    first = store.record_execution(i, 40)
    second = store.record_execution(i, 60)
    assert first is not None and second is not None
    got = store.load(i)
    assert got is not None
    assert (got.execution_count, got.total_execution_time_ms) == (2, 100)
    # expires_at = Redis now + the record's TTL, not the old expiry + something
    assert got.expires_at == second.expires_at
    assert abs((got.expires_at - got.last_used_at).total_seconds() - 120) < 0.01
    assert second.expires_at >= first.expires_at
    assert store.record_execution(ident("nobody"), 5) is None


def test_terminate_keeps_the_record_for_audit(store: SessionStore) -> None:
    i = ident()
    store.save(i, record(i))
    done = store.terminate(i, "manual")
    assert done.kind == "ok" and done.sandbox_id == "sb-p1"
    got = store.load(i)
    assert got is not None and got.status == "terminated"
    assert got.terminated_reason == "manual"
    assert store.list_active_for_tenant("acme") == []
    assert store.terminate(i, "manual").kind == "inactive"  # idempotent, nothing changes


def test_list_expired_returns_only_active_sessions_past_the_cutoff(
        store: SessionStore) -> None:
    past, future, done, errored = ident("past"), ident("future"), ident("done"), ident("err")
    store.save(past, record(past, expires_in_s=-5))
    store.save(future, record(future, expires_in_s=600))
    store.save(done, record(done, expires_in_s=-5, status="terminated"))
    store.save(errored, record(errored, expires_in_s=-5, status="error"))
    other = ident("other", tenant="globex")
    store.save(other, record(other, expires_in_s=-5))
    now = datetime.now(timezone.utc)
    assert set(store.list_expired(now)) == {past, other}
    assert store.list_expired(now, tenant_id="acme") == [past]
    assert set(store.list_expired(now + timedelta(hours=1))) == {past, other, future}


def test_a_tenant_cannot_load_another_tenants_session(coord: Coordinator,
                                                      store: SessionStore) -> None:
    mine = ident(tenant="acme")
    store.save(mine, record(mine))
    theirs = SessionStore(coord.client, prefix=coord.keyspace.prefix, tenant="globex")
    with pytest.raises(SessionTenantError):
        theirs.load(mine)
    with pytest.raises(SessionTenantError):
        theirs.list_active_for_tenant("acme")
    assert theirs.load(ident(tenant="globex")) is None  # its own (empty) keys
    assert theirs.tenants() == ["globex"]


def test_keys_carry_the_tenant_hash_tag(coord: Coordinator, store: SessionStore) -> None:
    i = ident()
    store.save(i, record(i))
    keys = [str(k) for k in coord.client.keys("*sess*") if not str(k).endswith(":tenants")]
    assert keys and all("{sess:acme}" in k for k in keys)


def test_bad_identity_is_a_typed_error() -> None:
    for bad in ("", "a:b", "x{y}", "é", "a" * 129):
        with pytest.raises(InvalidConfigError):
            ident(path=bad)


def test_store_failure_fails_closed() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                         decode_responses=True)
    store = SessionStore(client)
    with pytest.raises(SessionStoreUnavailableError):
        store.load(ident())


def test_a_bytes_client_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_responses"):
        SessionStore(redis.Redis(host="127.0.0.1", port=1))


def test_noscript_reload(coord: Coordinator, store: SessionStore) -> None:
    i = ident()
    store.save(i, record(i))
    coord.client.script_flush()
    assert store.load(i) is not None


def test_claims_admit_wait_lapse_and_commit(store: SessionStore) -> None:
    a, b = ident("a"), ident("b")
    first = store.acquire(a, cap=1, max_executions=10, claim_id="one", claim_ttl_ms=5000)
    assert first.kind == "claimed"
    assert store.acquire(a, cap=1, max_executions=10, claim_id="two",
                         claim_ttl_ms=5000).kind == "wait"  # same path: wait for it
    capped = store.acquire(b, cap=1, max_executions=10, claim_id="three", claim_ttl_ms=5000)
    assert capped.kind == "cap" and capped.count == 1  # a claim holds a slot of the cap
    assert store.commit(a, claim_id="two", ttl_ms=1000, fields=_fields(a)) is None
    made = store.commit(a, claim_id="one", ttl_ms=1000, fields=_fields(a))
    assert made is not None and made.status == "active" and made.generation == 1
    again = store.acquire(a, cap=1, max_executions=10, claim_id="four", claim_ttl_ms=5000)
    assert again.kind == "existing" and again.session == made


def test_a_lapsed_claim_cannot_commit_and_frees_its_slot(store: SessionStore) -> None:
    a, b = ident("a"), ident("b")
    assert store.acquire(a, cap=1, max_executions=10, claim_id="slow",
                         claim_ttl_ms=50).kind == "claimed"
    time.sleep(0.1)
    assert store.acquire(b, cap=1, max_executions=10, claim_id="next",
                         claim_ttl_ms=5000).kind == "claimed"
    assert store.commit(a, claim_id="slow", ttl_ms=1000, fields=_fields(a)) is None
    assert store.load(a) is None
    assert store.abandon(b, "next") and not store.abandon(b, "next")


def test_acquire_retires_an_exhausted_session(store: SessionStore) -> None:
    a = ident("a")
    store.acquire(a, cap=5, max_executions=2, claim_id="c1", claim_ttl_ms=5000)
    store.commit(a, claim_id="c1", ttl_ms=60_000, fields=_fields(a))
    store.record_execution(a, 1)
    store.record_execution(a, 1)
    got = store.acquire(a, cap=5, max_executions=2, claim_id="c2", claim_ttl_ms=5000)
    assert got.kind == "claimed" and got.retired_sandbox == "sb-a"
    old = store.load(a)
    assert old is not None and old.status == "terminated"
    assert old.terminated_reason == "rotated"
    store.commit(a, claim_id="c2", ttl_ms=60_000,
                 fields={**_fields(a), "sandbox_id": "sb-a2"})
    new = store.load(a)
    assert new is not None and new.generation == 2 and new.execution_count == 0
    assert [h.sandbox_id for h in store.history(a)] == ["sb-a"]  # kept for audit


def _fields(identity: ExecutionSessionIdentity) -> dict[str, str]:
    return {"tenant_id": identity.tenant_id, "conversation_id": identity.conversation_id,
            "path_id": identity.path_id, "sandbox_id": f"sb-{identity.path_id}",
            "provider": "local", "host": "h", "connection": "{}"}
