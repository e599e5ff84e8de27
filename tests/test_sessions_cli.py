"""``budgetctl sessions`` (the Typer sub-app) against a real Redis, with CliRunner."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner

from coordinator import Coordinator
from coordinator.sessions import ExecutionSession, ExecutionSessionIdentity, SessionStore
from coordinator.sessions.commands import app

runner = CliRunner()


def _save(store: SessionStore, tenant: str, path: str, expires_in_s: float) -> None:
    identity = ExecutionSessionIdentity(tenant_id=tenant, conversation_id="c1", path_id=path)
    now = datetime.now(timezone.utc)
    store.save(identity, ExecutionSession(
        identity=identity, sandbox_id=f"e2b-{path}", provider="e2b", created_at=now,
        last_used_at=now, updated_at=now, expires_at=now + timedelta(seconds=expires_in_s),
        ttl_ms=60_000))


def test_list_and_cleanup(coord: Coordinator, redis_url: str) -> None:
    store = SessionStore(coord.client, prefix=coord.keyspace.prefix)
    assert "no active sessions" in runner.invoke(app, ["list", "--redis", redis_url]).output
    _save(store, "acme", "live", 600)
    _save(store, "acme", "stale", -1)
    _save(store, "globex", "other", 600)

    listed = runner.invoke(app, ["list", "--redis", redis_url])
    assert listed.exit_code == 0, listed.output
    assert {line.split()[2] for line in listed.output.splitlines()} == {
        "live", "stale", "other"}
    only = runner.invoke(app, ["list", "--tenant", "globex", "--redis", redis_url])
    assert [line.split()[2] for line in only.output.splitlines()] == ["other"]

    # The sandboxes are records of a remote provider; cleanup with the local one expires
    # the records and reports that it cannot kill what is not on this host.
    cleaned = runner.invoke(app, ["cleanup", "--redis", redis_url])
    assert cleaned.exit_code == 0, cleaned.output
    assert "1 expired session cleaned up" in cleaned.output
    stale = store.load(ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1",
                                                path_id="stale"))
    assert stale is not None and stale.status == "expired"
    again = runner.invoke(app, ["list", "--redis", redis_url])
    assert "stale" not in again.output and "live" in again.output
    bad = runner.invoke(app, ["cleanup", "--provider", "docker", "--redis", redis_url])
    assert bad.exit_code == 2
