"""Execution sessions on the dashboard: /api/sessions and the Sessions page against a real
Redis, sessions saved through SessionStore, the dashboard served by uvicorn in its own
process (python -m coordinator.dashboard)."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from coordinator import Coordinator
from coordinator.sessions import ExecutionSession, ExecutionSessionIdentity, SessionStore
from tests.support.dashboard_server import (
    ACME_TOKEN,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    coordinator,
    dashboard,
)

pytest.importorskip("starlette")


def _session(tenant: str, conv: str, path: str, *, status: str = "active",
             sandbox: str | None = None, root: str = "") -> ExecutionSession:
    now = datetime.now(timezone.utc)
    return ExecutionSession(
        identity=ExecutionSessionIdentity(tenant_id=tenant, conversation_id=conv,
                                          path_id=path),
        sandbox_id=sandbox or f"sb-{conv}-{path}", provider="local", host="node-7",
        created_at=now, last_used_at=now, updated_at=now,
        expires_at=now + timedelta(minutes=30), status=status, ttl_ms=1_800_000,
        execution_count=3, total_execution_time_ms=1234, budget_root=root)


def _save(store: SessionStore, *sessions: ExecutionSession) -> None:
    for s in sessions:
        store.save(s.identity, s)


def _rows(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["tenant"], s["conversation"], s["path"]) for s in data["sessions"]]


def test_sessions_appear_in_the_api_and_on_the_page(redis_url: str) -> None:
    coord: Coordinator = coordinator(redis_url)
    store = SessionStore.for_coordinator(coord)
    _save(store, _session("t1", "c1", "main", root="root-c1"), _session("t1", "c1", "b2"),
          _session("t2", "c9", "main", sandbox="<b>sb</b>"),
          _session("t1", "c2", "gone", status="terminated"))
    with dashboard(redis_url) as http:
        data = http.json("/api/sessions", VIEWER_TOKEN)
        assert data["total"] == 3 and data["tenant"] == ""
        # tenants in name order; the terminated session is not listed
        assert sorted(_rows(data)) == [("t1", "c1", "b2"), ("t1", "c1", "main"),
                                       ("t2", "c9", "main")]
        assert _rows(data)[-1] == ("t2", "c9", "main")
        row = next(s for s in data["sessions"] if s["path"] == "main" and s["tenant"] == "t1")
        assert row["provider"] == "local" and row["sandbox_id"] == "sb-c1-main"
        assert row["host"] == "node-7" and row["status"] == "active"
        assert row["execution_count"] == 3 and row["total_execution_ms"] == 1234
        assert row["budget_root"] == "root-c1"
        assert datetime.fromisoformat(row["expires_at"]) > datetime.fromisoformat(
            row["created_at"])
        # pages: size 2 then the rest, no row twice
        first = http.json("/api/sessions?size=2&page=1", VIEWER_TOKEN)
        second = http.json("/api/sessions?size=2&page=2", VIEWER_TOKEN)
        assert len(first["sessions"]) == 2 and len(second["sessions"]) == 1
        assert sorted(_rows(first) + _rows(second)) == sorted(_rows(data))
        assert http.request("GET", "/api/sessions?size=0", token=VIEWER_TOKEN)[0] == 400
        # the page: every row, the budget link to the tree page, values escaped
        status, _, body = http.request("GET", "/sessions", token=VIEWER_TOKEN)
        assert status == 200
        assert "sb-c1-main" in body and "c9" in body and "gone" not in body
        assert 'href="/trees/root-c1?tenant="' in body
        assert "<b>sb</b>" not in body and "&lt;b&gt;sb&lt;/b&gt;" in body
        assert 'href="/sessions?tenant="' in http.request("GET", "/", token=VIEWER_TOKEN)[2]
        # a session terminated since is gone (once the 0.25 s read cache has passed)
        s = store.load(ExecutionSessionIdentity(tenant_id="t1", conversation_id="c1",
                                                path_id="b2"))
        assert s is not None
        store.terminate(s.identity, "manual")
        deadline = time.monotonic() + 5
        while ("t1", "c1", "b2") in _rows(http.json("/api/sessions", VIEWER_TOKEN)):
            assert time.monotonic() < deadline, "a terminated session is still listed"
            time.sleep(0.1)
        assert http.json("/api/sessions", VIEWER_TOKEN)["total"] == 2
    coord.close()


def test_a_tenant_bound_viewer_sees_only_its_tenant(redis_url: str) -> None:
    default, acme = coordinator(redis_url), coordinator(redis_url, tenant="acme")
    _save(SessionStore.for_coordinator(acme), _session("acme", "c-acme", "main"))
    _save(SessionStore.for_coordinator(default), _session("other", "c-other", "main"))
    with dashboard(redis_url, env={"BUDGET_DASHBOARD_TENANTS": ",acme"}) as http:
        assert _rows(http.json("/api/sessions", ACME_TOKEN)) == [("acme", "c-acme", "main")]
        assert http.request("GET", "/api/sessions?tenant=", token=ACME_TOKEN)[0] == 403
        assert http.request("GET", "/sessions?tenant=", token=ACME_TOKEN)[0] == 403
        status, _, body = http.request("GET", "/sessions", token=ACME_TOKEN)
        assert status == 200 and "c-acme" in body and "c-other" not in body
        # an unbound operator chooses the tenant
        assert _rows(http.json("/api/sessions?tenant=", OPERATOR_TOKEN)) == [
            ("other", "c-other", "main")]
        assert _rows(http.json("/api/sessions?tenant=acme", OPERATOR_TOKEN)) == [
            ("acme", "c-acme", "main")]
        assert http.request("GET", "/api/sessions?tenant=nope",
                            token=OPERATOR_TOKEN)[0] == 404
    default.close()
    acme.close()


def test_unauthenticated_is_refused_like_the_trees_api(redis_url: str) -> None:
    coord = coordinator(redis_url)
    _save(SessionStore.for_coordinator(coord), _session("t1", "secret-conv", "main"))
    with dashboard(redis_url) as http:
        trees = http.request("GET", "/api/trees")
        sessions = http.request("GET", "/api/sessions")
        assert trees[0] == sessions[0] == 401
        assert json.loads(trees[2]) == json.loads(sessions[2])
        assert sessions[1]["www-authenticate"] == trees[1]["www-authenticate"] == "Bearer"
        assert "secret-conv" not in sessions[2]

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kw: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        for page, target in (("/", "/login?next=/"), ("/sessions", "/login?next=/sessions")):
            try:
                opener.open(http.base + page, timeout=10)
                raise AssertionError(f"{page} served without credentials")
            except urllib.error.HTTPError as exc:
                with exc:
                    assert exc.code == 303 and exc.headers["location"] == target
    coord.close()


def test_a_page_reads_redis_by_page_size_not_by_sessions(redis_url: str) -> None:
    from coordinator.store.session_reads import active_page

    coord = coordinator(redis_url)
    store = SessionStore.for_coordinator(coord)
    counter = coordinator(redis_url).client

    def cost(offset: int, limit: int) -> int:
        stats: Any = counter.info("commandstats")
        before = sum(int(v["calls"]) for v in stats.values())
        page = active_page(store, offset, limit)
        assert len(page.sessions) == min(limit, max(0, page.total - offset))
        stats = counter.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values()) - before - 1  # the INFO

    costs = []
    for batch in range(2):
        _save(store, *(_session("t1", f"c{batch}", f"p{i}") for i in range(30)))
        costs.append((cost(0, 5), cost(25, 10)))
    # SMEMBERS, ZCARD, TIME, ZRANGE and one HGETALL per row, however many are stored
    assert costs[0][0] == costs[1][0] == 4 + 5
    assert costs[0][1] == 4 + 5 and costs[1][1] == 4 + 10
    coord.close()
    counter.close()
