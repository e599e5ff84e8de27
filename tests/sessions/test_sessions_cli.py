"""``budgetctl sessions`` (the Typer sub-app) against a real Redis, with CliRunner."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner, Result

from coordinator import Coordinator
from coordinator.cli import app
from coordinator.sessions import ExecutionSession, ExecutionSessionIdentity, SessionStore

runner = CliRunner()


def sessions(redis_url: str, *args: str) -> Result:
    """``budgetctl --redis URL sessions ARGS``."""
    return runner.invoke(app, ["--redis", redis_url, "sessions", *args])


def _save(store: SessionStore, tenant: str, path: str, expires_in_s: float) -> None:
    identity = ExecutionSessionIdentity(tenant_id=tenant, conversation_id="c1", path_id=path)
    now = datetime.now(timezone.utc)
    store.save(identity, ExecutionSession(
        identity=identity, sandbox_id=f"e2b-{path}", provider="e2b", created_at=now,
        last_used_at=now, updated_at=now, expires_at=now + timedelta(seconds=expires_in_s),
        ttl_ms=60_000))


def test_list_and_cleanup(coord: Coordinator, redis_url: str) -> None:
    store = SessionStore(coord.client, prefix=coord.keyspace.prefix)
    assert "no active sessions" in sessions(redis_url, "list").output
    _save(store, "acme", "live", 600)
    _save(store, "acme", "stale", -1)
    _save(store, "globex", "other", 600)

    listed = sessions(redis_url, "list")
    assert listed.exit_code == 0, listed.output
    assert {line.split()[2] for line in listed.output.splitlines()} == {
        "live", "stale", "other"}
    live = next(line for line in listed.output.splitlines() if " live " in line)
    assert re.search(r"expires in \d+m\d\ds$", live), live  # 9m59s, never 599 s
    only = sessions(redis_url, "list", "--tenant", "globex")
    assert [line.split()[2] for line in only.output.splitlines()] == ["other"]

    # The sandboxes are records of a remote provider; cleanup with the local one expires
    # the records and reports that it cannot kill what is not on this host.
    cleaned = sessions(redis_url, "cleanup")
    assert cleaned.exit_code == 0, cleaned.output
    assert "1 expired session cleaned up" in cleaned.output
    stale = store.load(ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1",
                                                path_id="stale"))
    assert stale is not None and stale.status == "expired"
    again = sessions(redis_url, "list")
    assert "stale" not in again.output and "live" in again.output
    bad = sessions(redis_url, "cleanup", "--provider", "docker")
    assert bad.exit_code == 2
