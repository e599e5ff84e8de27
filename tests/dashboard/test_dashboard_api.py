"""The dashboard's JSON API, pages and security against a real Redis, served by uvicorn
in its own process (python -m coordinator.dashboard)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from coordinator import ChainMetadata, ExecutionContext, SafetyEvent
from coordinator.core.keys import VIEW_SHARDS
from coordinator.dashboard.command import UnsafeBindError, serve
from coordinator.embedded import RedisServer
from tests.support.dashboard_server import (
    ACME_TOKEN,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    Http,
    coordinator,
    dashboard,
    open_tree,
    spend,
)

pytest.importorskip("starlette")


def _wait(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def _ids(http: Http, query: str) -> list[str]:
    return [t["id"] for t in http.json(f"/api/trees?{query}")["trees"]]


def test_trees_are_listed_sorted_filtered_and_paginated(redis_url: str) -> None:
    coord = coordinator(redis_url)
    spent = {"cheap": 0.05, "mid": 0.30, "big": 0.60}
    trees = {}
    for name, usd in spent.items():
        trees[name] = open_tree(coord, name, ceiling=1.0 if name != "mid" else 0.4,
                                team="infra" if name == "cheap" else "research")
        spend(trees[name], usd, tokens=100, provider="openai")
        time.sleep(0.01)  # distinct creation times: a defined newest-first order
    coord.store.flush()
    with dashboard(redis_url) as http:
        # the indexer sorts by spend, by fraction of the ceiling (mid: 75 %), by burn rate
        _wait(lambda: _ids(http, "sort=spend") == ["big", "mid", "cheap"])
        assert _ids(http, "sort=fraction") == ["mid", "big", "cheap"]
        assert _ids(http, "sort=age") == ["big", "mid", "cheap"]
        assert _ids(http, "sort=spend&label=team%3Dresearch") == ["big", "mid"]
        assert _ids(http, "sort=spend&label=team%3Dinfra") == ["cheap"]
        page2 = http.json("/api/trees?sort=spend&size=2&page=2")
        assert page2["total"] == 3 and [t["id"] for t in page2["trees"]] == ["cheap"]
        big = http.json("/api/trees?sort=spend")["trees"][0]
        assert big["spend_usd"] == pytest.approx(0.60)
        assert big["ceiling_usd"] == pytest.approx(1.0)
        assert big["labels"] == {"org": "acme", "team": "research", "service": "agent"}
        assert (big["tokens_in"], big["tokens_out"], big["steps"]) == (100, 50, 1)
        # burn rate: USD spent over the last minute (all of its spend, for a tree younger
        # than that), and the minutes left at that rate before spend reaches the ceiling
        big = _wait(lambda: next((t for t in http.json("/api/trees?sort=burn")["trees"]
                                  if t["id"] == "big" and t["usd_per_min"] > 0), None))
        assert big["usd_per_min"] == pytest.approx(0.6)
        assert big["minutes_to_ceiling"] == pytest.approx(0.4 / big["usd_per_min"], rel=0.01)
        assert _ids(http, "sort=burn")[0] == "big"
        # bad input is a clear 400, not a stack trace
        for query in ("sort=cost", "label=colour%3Dred", "size=0", "page=x"):
            status, _, body = http.request("GET", f"/api/trees?{query}", token=VIEWER_TOKEN)
            assert status == 400, query
            assert "error" in json.loads(body)
    for ctx in trees.values():
        ctx.close()
    coord.close()


def test_tree_detail_whole_tree_inherited_stop_nodes_events_tokens(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "orchestrator")
    child = root.spawn_child(max_cost_usd=0.5, metadata=ChainMetadata(
        request_id="task-1", chain_id="task-1", service="research",
        tags={"celery_task": "agents.research", "celery_retries": "0",
              "celery_host": "worker@host-b"}))
    grandchild = child.spawn_child(max_cost_usd=0.2)
    spend(grandchild, 0.05, tokens=400, provider="anthropic", operation="summarise")
    spend(root, 0.01, tokens=10, provider="openai", operation="plan")
    child.abort("runaway loop")
    coord.store.flush()
    with dashboard(redis_url) as http:
        data = http.json(f"/api/trees/{grandchild.chain_id}")
        assert data["root"] == "orchestrator" and data["focus"] == grandchild.chain_id
        ctxs = data["contexts"]
        assert set(ctxs) == {"orchestrator", child.chain_id, grandchild.chain_id}
        assert ctxs["orchestrator"]["children"] == [child.chain_id]
        assert ctxs[child.chain_id]["ceiling_usd"] == pytest.approx(0.5)
        assert ctxs[child.chain_id]["task"] == {"name": "agents.research",
                                                "host": "worker@host-b", "retries": "0"}
        assert ctxs["orchestrator"]["task"] is None
        assert ctxs[grandchild.chain_id]["ceiling_usd"] == pytest.approx(0.2)
        assert ctxs[grandchild.chain_id]["spend_usd"] == pytest.approx(0.05)
        assert ctxs["orchestrator"]["spend_usd"] == pytest.approx(0.06)
        assert ctxs["orchestrator"]["status"] == "running"
        # the grandchild inherits the child's stop and its reason
        for cid in (child.chain_id, grandchild.chain_id):
            assert ctxs[cid]["status"] == "stopped"
            assert ctxs[cid]["reason"] == "aborted"
            assert ctxs[cid]["detail"] == "runaway loop"
            assert ctxs[cid]["stopped_by"] == child.chain_id
        assert data["tokens_by_provider"] == {"anthropic": {"input": 400, "output": 200},
                                              "openai": {"input": 10, "output": 5}}
        ops = {n["operation"]: n for n in data["nodes"]}
        assert ops["summarise"]["cost_usd"] == pytest.approx(0.05)
        assert ops["summarise"]["context"] == grandchild.chain_id
        assert ops["summarise"]["input_tokens"] == 400 and ops["summarise"]["status"] == "ok"
        assert ops["summarise"]["duration_ms"] is not None
        assert any(e["event_type"] == "aborted" and e["context"] == child.chain_id
                   for e in data["events"])
        # unknown ids: 404, as JSON and as a page
        status, _, body = http.request("GET", "/api/trees/no-such-tree", token=VIEWER_TOKEN)
        assert status == 404 and "no-such-tree" in json.loads(body)["error"]
        status, headers, body = http.request("GET", "/trees/no-such-tree", token=VIEWER_TOKEN)
        assert status == 404 and headers["content-type"].startswith("text/html")
        assert "Traceback" not in body
    root.close()
    coord.close()


def test_abort_needs_an_operator_and_is_recorded_with_who_and_why(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "run-1")
    child = root.spawn_child()
    coord.store.flush()
    with dashboard(redis_url) as http:
        path = f"/api/trees/{child.chain_id}/abort"
        # no credentials, a viewer, a session without CSRF token: refused, nothing changes
        assert http.request("POST", path, body={"reason": "x"})[0] == 401
        assert http.request("POST", path, token=VIEWER_TOKEN, body={"reason": "x"})[0] == 403
        assert http.request("POST", path, token=OPERATOR_TOKEN, body={})[0] == 400
        assert ExecutionContext.load_snapshot(child.chain_id, coord).status == "running"
        status, _, body = http.request("POST", path, token=OPERATOR_TOKEN,
                                       body={"reason": "costs too much"})
        assert status == 200, body
        assert json.loads(body)["by"] == "token-1"
        snap = ExecutionContext.load_snapshot(child.chain_id, coord)
        assert snap.status == "stopped" and snap.abort_reason == "aborted"
        recorded = [e for e in snap.events if e.event_type == "operator_abort"]
        assert len(recorded) == 1
        assert recorded[0].metadata["actor"] == "token-1"
        assert recorded[0].metadata["reason"] == "costs too much"
        assert isinstance(recorded[0], SafetyEvent)
        stop = [e for e in snap.events if e.event_type == "aborted"][0]
        assert stop.reason == "costs too much (by token-1 via dashboard)"
        assert ExecutionContext.load_snapshot("run-1", coord).status == "running"
        # aborting it again changes nothing and says so
        status, _, body = http.request("POST", path, token=OPERATOR_TOKEN,
                                       body={"reason": "again"})
        assert status == 409 and "already stopped (aborted)" in body
        events = ExecutionContext.load_snapshot(child.chain_id, coord).events
        assert len([e for e in events if e.event_type == "operator_abort"]) == 1
        assert http.request("POST", "/api/trees/nope/abort", token=OPERATOR_TOKEN,
                            body={"reason": "x"})[0] == 404
    root.close()
    coord.close()


def _login(http: Http, user: str, password: str) -> tuple[str, str]:
    """Log in through the form; returns the session cookie and its CSRF token."""
    status, headers, body = http.request("GET", "/login")
    cookie = headers["set-cookie"].split(";")[0]
    csrf = re.search(r'name="csrf" value="([^"]+)"', body).group(1)  # type: ignore[union-attr]
    form = urllib.parse.urlencode({"user": user, "password": password, "csrf": csrf})
    req = urllib.request.Request(http.base + "/login", data=form.encode(), method="POST",
                                 headers={"Cookie": cookie,
                                          "Content-Type": "application/x-www-form-urlencoded"})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kw: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        opener.open(req)
        raise AssertionError("login did not redirect")
    except urllib.error.HTTPError as exc:
        exc.close()
        assert exc.code == 303, f"login answered {exc.code}"
        cookie = exc.headers["set-cookie"].split(";")[0]
    status, _, body = http.request("GET", "/", headers={"Cookie": cookie})
    assert status == 200
    csrf = re.search(r'name="csrf" value="([^"]+)"', body).group(1)  # type: ignore[union-attr]
    return cookie, csrf


def test_session_actions_need_the_csrf_token(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "run-csrf")
    coord.store.flush()
    with dashboard(redis_url) as http:
        cookie, csrf = _login(http, "olga", "olga-pw")
        form = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
        status, _, _ = http.request("POST", "/trees/run-csrf/abort", headers=form,
                                    body=None)
        assert status == 403
        ok = http.request("POST", "/api/trees/run-csrf/abort",
                          headers={"Cookie": cookie, "X-CSRF-Token": "forged"},
                          body={"reason": "x"})
        assert ok[0] == 403
        assert ExecutionContext.load_snapshot("run-csrf", coord).status == "running"
        status, _, body = http.request("POST", "/api/trees/run-csrf/abort",
                                       headers={"Cookie": cookie, "X-CSRF-Token": csrf},
                                       body={"reason": "stop it"})
        assert status == 200, body
        assert ExecutionContext.load_snapshot("run-csrf", coord).status == "stopped"
        # a wrong password is refused (the login page again, 401); after five failures
        # the user name is locked for a minute, even with the right password (429)
        for _ in range(5):
            with pytest.raises(AssertionError, match="401"):
                _login(http, "victor", "wrong")
        with pytest.raises(AssertionError, match="429"):
            _login(http, "victor", "victor-pw")
        _login(http, "olga", "olga-pw")  # another user is not locked
    root.close()
    coord.close()


def test_tenant_scoping(redis_url: str) -> None:
    default, acme = coordinator(redis_url), coordinator(redis_url, tenant="acme")
    mine, theirs = open_tree(acme, "acme-run"), open_tree(default, "default-run")
    acme.store.flush()
    default.store.flush()
    env = {"BUDGET_DASHBOARD_TENANTS": ",acme"}
    with dashboard(redis_url, env=env) as http:
        assert _wait(lambda: _ids(http, "tenant=acme&sort=age") == ["acme-run"])
        assert _ids(http, "sort=age") == ["default-run"]
        # bound to acme: acme's trees by default, 403 for the other tenant
        assert [t["id"] for t in http.json("/api/trees?sort=age", ACME_TOKEN)["trees"]] == [
            "acme-run"]
        assert http.request("GET", "/api/trees?tenant=", token=ACME_TOKEN)[0] == 403
        assert http.request("GET", "/api/trees/default-run?tenant=",
                            token=ACME_TOKEN)[0] == 403
        # another tenant's tree is not found in acme's key space
        assert http.request("GET", "/api/trees/default-run", token=ACME_TOKEN)[0] == 404
        assert http.request("GET", "/api/trees?tenant=nope", token=OPERATOR_TOKEN)[0] == 404
    mine.close()
    theirs.close()
    acme.close()
    default.close()


def test_labels_are_escaped_and_no_secret_is_rendered(redis_url: str) -> None:
    coord = coordinator(redis_url)
    evil = "<script>document.title='pwned'</script>"
    root = open_tree(coord, "xss-run", team=evil)
    spend(root, 0.01)
    token = root.token
    coord.store.flush()
    with dashboard(redis_url) as http:
        _wait(lambda: "xss-run" in _ids(http, "sort=spend"))
        for page in ("/", "/trees/xss-run", "/spend"):
            status, headers, body = http.request("GET", page, token=VIEWER_TOKEN)
            assert status == 200
            assert "<script>document" not in body
            assert token not in body and OPERATOR_TOKEN not in body
            assert "script-src 'self'" in headers["content-security-policy"]
        assert "&lt;script&gt;document.title" in http.request(
            "GET", "/trees/xss-run", token=VIEWER_TOKEN)[2]
    root.close()
    coord.close()


def test_spend_json_and_csv(redis_url: str) -> None:
    coord = coordinator(redis_url)
    closing = open_tree(coord, "closed-run", team="=cmd|calc")
    spend(closing, 0.25, tokens=300, provider="openai")
    running = open_tree(coord, "open-run", team="research")
    spend(running, 0.5)
    coord.store.flush()
    with dashboard(redis_url) as http:
        def rows() -> dict[tuple[str, str], Any]:
            return {(r["label"], r["value"]): r for r in http.json("/api/spend")["rows"]}
        got = _wait(lambda: rows() if ("provider", "openai.input") in rows() else None)
        assert got[("team", "research")]["open"] == pytest.approx(0.5)
        assert got[("team", "=cmd|calc")]["open"] == pytest.approx(0.25)
        assert got[("provider", "openai.input")]["open"] == 300
        closing.close()  # the library's closed view, and the indexer sees it leave
        def closed_rows() -> dict[tuple[str, str], Any] | None:
            r = rows()
            done = (r.get(("team", "=cmd|calc"), {}).get("closed", 0) > 0
                    and r.get(("provider", "openai.input"), {}).get("closed", 0) > 0)
            return r if done else None
        got = _wait(closed_rows)
        assert got[("team", "=cmd|calc")]["closed"] == pytest.approx(0.25)
        assert got[("provider", "openai.input")]["closed"] == 300
        assert got[("provider", "openai.output")]["closed"] == 150
        status, headers, body = http.request("GET", "/api/spend.csv", token=VIEWER_TOKEN)
        assert status == 200 and headers["content-type"].startswith("text/csv")
        assert "'=cmd|calc" in body  # a formula is never handed to a spreadsheet
        assert http.request("GET", "/api/spend?day=yesterday", token=VIEWER_TOKEN)[0] == 400
        status, _, page = http.request("GET", "/spend", token=VIEWER_TOKEN)
        assert status == 200 and "<svg" in page and "=cmd|calc" in page
    running.close()
    coord.close()


def test_metrics_and_health(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "metered", team="research")
    spend(root, 0.2, tokens=1000, provider="openai")
    coord.store.flush()
    with dashboard(redis_url) as http:
        def scrape() -> str:
            status, headers, body = http.request("GET", "/metrics", token=VIEWER_TOKEN)
            assert status == 200 and headers["content-type"].startswith("text/plain")
            return body
        def labelled() -> str | None:
            body = scrape()
            return body if 'value="research"' in body else None
        body = _wait(labelled)
        assert 'budget_open_trees{tenant=""} 1.0' in body
        assert 'budget_open_spend_usd{label="team",tenant="",value="research"} 0.2' in body
        assert 'budget_open_tokens{direction="input",provider="openai",tenant=""} 1000.0' in body
        assert "budget_dashboard_alerts_total" in body
        assert http.request("GET", "/metrics")[0] == 401
        health = json.loads(http.request("GET", "/healthz")[2])
        assert health == {"ok": True, "redis": True, "listener": True, "indexers": {"": True}}
    root.close()
    coord.close()


def test_redis_down_is_a_503_page_with_retry() -> None:
    with RedisServer() as server:
        with dashboard(server.url) as http:
            server.stop()
            status, headers, body = http.request("GET", "/", token=VIEWER_TOKEN)
            assert status == 503 and headers["retry-after"] == "5"
            assert "Redis is unavailable" in body and "Traceback" not in body
            assert 'http-equiv="refresh"' in body
            status, _, body = http.request("GET", "/api/trees", token=VIEWER_TOKEN)
            assert status == 503 and json.loads(body)["status"] == 503
            assert http.request("GET", "/healthz")[0] == 503
            server.start()  # the same port: the dashboard answers again by itself
            _wait(lambda: http.request("GET", "/healthz")[0] == 200)
            assert http.request("GET", "/api/trees", token=VIEWER_TOKEN)[0] == 200


def test_refuses_a_public_address_without_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUDGET_DASHBOARD_USERS", raising=False)
    monkeypatch.delenv("BUDGET_DASHBOARD_TOKENS", raising=False)
    with pytest.raises(UnsafeBindError, match="BUDGET_DASHBOARD_USERS"):
        serve("redis://127.0.0.1:1/0", host="0.0.0.0", port=1)


def test_without_credentials_pages_are_open_and_actions_refused(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "local-run")
    coord.store.flush()
    with dashboard(redis_url, auth=False) as http:
        assert http.request("GET", "/api/trees/local-run")[0] == 200
        status, _, body = http.request("POST", "/api/trees/local-run/abort",
                                       body={"reason": "x"})
        assert status == 403 and "no credentials are configured" in body
        assert ExecutionContext.load_snapshot("local-run", coord).status == "running"
    root.close()
    coord.close()


def test_mounted_in_another_app(redis_url: str) -> None:
    """create_app mounted under /budget of a parent Starlette app (whose lifespan does
    not start the dashboard's: its threads start with the first request)."""
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from coordinator.dashboard import Auth, create_app
    from coordinator.embedded import free_port
    from tests.support.dashboard_server import TOKENS, USERS

    coord = coordinator(redis_url)
    root = open_tree(coord, "mounted-run")
    spend(root, 0.1)
    coord.store.flush()
    dash = create_app(coord, auth=Auth.parse(USERS, TOKENS))
    parent = Starlette(routes=[Route("/", lambda r: PlainTextResponse("parent")),
                               Mount("/budget", app=dash)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(parent, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        http = Http(f"http://127.0.0.1:{port}")
        assert http.request("GET", "/")[2] == "parent"
        assert _wait(lambda: "mounted-run" in [
            t["id"] for t in http.json("/budget/api/trees?sort=spend")["trees"]])
        status, _, body = http.request("GET", "/budget/trees/mounted-run", token=VIEWER_TOKEN)
        assert status == 200 and 'href="/budget/static/dashboard.css"' in body
        assert 'data-base="/budget"' in body
        assert http.request("GET", "/budget/static/dashboard.js")[0] == 200
        # without a session: sent to the mounted login page, and back to the page after
        req = urllib.request.Request(http.base + "/budget/trees/mounted-run")

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kw: Any) -> None:
                return None

        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.build_opener(NoRedirect).open(req)
        caught.value.close()
        assert caught.value.code == 303
        assert caught.value.headers["location"] == (
            "/budget/login?next=/trees/mounted-run")
    finally:
        server.should_exit = True
        thread.join(10)
        dash.state.dashboard.stop()
    root.close()
    coord.close()


def test_shield_shows_breakers_and_windows(redis_url: str) -> None:
    import uuid

    from coordinator import BudgetWindowHook, CircuitBreaker, ToolCallContext

    coord = coordinator(redis_url)
    breaker = CircuitBreaker("openai", failure_threshold=2, recovery_timeout_s=60,
                             coordinator=coord)
    breaker.record_failure()
    breaker.record_failure()
    window = BudgetWindowHook(scope="service", max_calls=10, max_usd=5.0, window_s=60,
                              coordinator=coord)
    for _ in range(3):
        window.admit(ToolCallContext(request_id="req", chain_id="chain",
                                     node_id=uuid.uuid4().hex, kind="llm", service="search",
                                     cost_estimate_usd=0.25))
    with dashboard(redis_url) as http:
        data = _wait(lambda: (d := http.json("/api/shield"))["breakers"] and d)
        assert data["breakers"] == [{"name": "openai", "state": "OPEN", "failures": 2,
                                     "probe_holder": None,
                                     "opened_ms": data["breakers"][0]["opened_ms"]}]
        assert data["windows"] == [{"name": "default:service:search", "calls": 3,
                                    "usd": pytest.approx(0.75)}]
        status, _, page = http.request("GET", "/shield", token=VIEWER_TOKEN)
        assert status == 200 and "OPEN" in page and "default:service:search" in page
        metrics = http.request("GET", "/metrics", token=VIEWER_TOKEN)[2]
        assert 'budget_breaker_state{name="openai",state="OPEN",tenant=""} 1.0' in metrics
    coord.close()


def test_a_wide_tree_is_cut_at_the_page_limit(redis_url: str) -> None:
    from coordinator.dashboard.model import ROW_FIELDS
    from coordinator.store.dashboard_reads import DashboardReads

    coord = coordinator(redis_url)
    root = open_tree(coord, "wide-run")
    kids = [root.spawn_child(max_cost_usd=0.01) for _ in range(12)]
    for kid in kids[:3]:
        kid.spawn_child(max_cost_usd=0.001)
    coord.store.flush()
    views = DashboardReads(coord.client, coord.keyspace, ROW_FIELDS)
    whole = views.tree("wide-run", max_contexts=100, recent=5)
    assert len(whole.hashes) == 16 and not whole.truncated
    cut = views.tree("wide-run", max_contexts=10, recent=5)
    assert len(cut.hashes) == 10 and cut.truncated
    assert all(child in cut.hashes for kids_ in cut.children.values() for child in kids_)
    root.close()
    coord.close()


def test_a_page_costs_commands_by_page_size_not_by_trees(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.dashboard.indexer import Indexer
    from coordinator.dashboard.model import ROW_FIELDS
    from coordinator.store import dashboard_reads
    from coordinator.store.dashboard_index import DashboardIndex
    from coordinator.store.dashboard_reads import DashboardReads

    coord = coordinator(redis_url)
    views = DashboardReads(coord.client, coord.keyspace, ROW_FIELDS)
    indexer = Indexer(DashboardIndex(coord.client, coord.keyspace))
    counter = coordinator(redis_url).client

    def commands() -> int:
        stats: Any = counter.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    def page_cost(**kw: Any) -> int:
        before = commands()
        views.page(**kw)
        return commands() - before - 1  # the INFO itself

    trees = []
    costs = []
    for batch in range(2):
        for i in range(40):
            trees.append(open_tree(coord, f"t{batch}-{i}", team=f"team{i % 2}"))
            spend(trees[-1], 0.001 * (i + 1))
        coord.store.flush()
        indexer.sweep()
        costs.append((page_cost(sort="spend", scope=None, offset=0, limit=10),
                      page_cost(sort="burn", scope="team=team1", offset=10, limit=10),
                      page_cost(sort="age", scope=None, offset=0, limit=10)))
    # 10 rows + range, size, rates, TIME; the newest of all trees reads the library's
    # open-tree shards instead of one index: a range and a size per shard
    assert costs[0] == costs[1] == (14, 14, 10 + 2 * VIEW_SHARDS + 2)
    # the shards merge into one order: two pages are the 20 newest of all 80 trees
    created = {r: s for key in coord.keyspace.roots_shards()
               for r, s in coord.client.zrange(key, 0, -1, withscores=True)}
    first, second = (views.page(sort="age", scope=None, offset=o, limit=10) for o in (0, 10))
    assert first.total == 80 and len(set(first.roots + second.roots)) == 20
    assert [created[r] for r in first.roots + second.roots] == \
        sorted(created.values(), reverse=True)[:20]
    # deeper pages read the indexer's age index instead (one range, whatever the depth)
    monkeypatch.setattr(dashboard_reads, "SHARDS_DEPTH", 20)
    assert page_cost(sort="age", scope=None, offset=20, limit=10) == 14
    deep = views.page(sort="age", scope=None, offset=20, limit=10)
    assert deep.total == 80
    assert [created[r] for r in deep.roots] == sorted(created.values(), reverse=True)[20:30]
    for ctx in trees:
        ctx.close()
    coord.close()
    counter.close()
