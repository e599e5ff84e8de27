"""What an operator sees in a browser: a page that notices Redis going away, a change
made right after a page loads, charts, big trees, the layout rules (Playwright driving
Debian's Chromium against the dashboard under uvicorn)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from coordinator.embedded import RedisServer
from coordinator.sessions import ExecutionSession, ExecutionSessionIdentity, SessionStore
from tests.support.browser import browser_fixture, login, page_fixture  # noqa: F401 (fixtures)
from tests.support.dashboard_server import coordinator, dashboard, open_tree, spend


def test_the_live_dot_turns_within_five_seconds_of_redis_going_down(page: Any) -> None:
    with RedisServer() as server:
        coord = coordinator(server.url)
        run = open_tree(coord, "down-run", ceiling=1.0)
        spend(run, 0.1)
        coord.store.flush()
        with dashboard(server.url) as http:
            login(page, http, "victor", "victor-pw")
            page.goto(f"{http.base}/trees/down-run")
            page.wait_for_selector("#live-state.on")
            server.stop()
            killed = time.monotonic()
            page.wait_for_selector("#live-state.off", timeout=5_000)
            assert time.monotonic() - killed < 5.0
            page.wait_for_timeout(1_500)
            text = page.inner_text("#live-state")
            assert "disconnected, last update" in text and " s ago" in text
            seconds = int(text.split("last update ")[1].split(" s ago")[0])
            assert 1 <= seconds <= 8
        coord.close()


def test_a_spend_right_after_the_page_loads_shows_without_the_fallback(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "quick-run", ceiling=1.0)
    coord.store.flush()
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        for _ in range(3):
            page.goto(f"{http.base}/trees/quick-run")
            before = float(page.get_attribute('details[data-id="quick-run"]', "data-spend"))
            spend(run, 0.01)
            coord.store.flush()
            landed = time.monotonic()
            while float(page.get_attribute('details[data-id="quick-run"]',
                                           "data-spend")) == before:
                assert time.monotonic() - landed < 3.0, "shown only by the 10 s fallback"
                page.wait_for_timeout(50)
    run.close()
    coord.close()


def _usd_of(page: Any, selector: str) -> float:
    return float(page.get_attribute(selector, "data-usd"))


def test_each_chart_exists_and_ends_at_the_trees_spend(redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "charted-run", ceiling=1.0)
    spend(run, 0.25)
    worker = run.spawn_child(max_cost_usd=0.5)
    spend(worker, 0.125)
    worker.abort("looping")
    coord.store.flush()
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        # the overview: a sparkline per tree, ending at its spend
        page.wait_for_selector('tr[data-id="charted-run"] svg.spark polyline')
        assert _usd_of(page, 'tr[data-id="charted-run"] svg.spark circle.last') == 0.375
        # the tree page: spend over time, with the ceiling line and the abort's moment
        page.goto(f"{http.base}/trees/charted-run")
        chart = "svg.spend-chart"
        assert page.locator(f"{chart} polyline.line").count() == 1
        assert page.locator(f"{chart} line.ceiling").count() == 1
        assert page.locator(f"{chart} line.stop-mark").count() == 1
        assert "aborted" in page.inner_html(f"{chart} line.stop-mark")
        assert _usd_of(page, f"{chart} circle.last") == 0.375
        spent = http.json("/api/trees/charted-run")["contexts"]["charted-run"]["spend_usd"]
        assert spent == 0.375
        # the line's last point is the circle: where the tree's spend is now
        points = page.get_attribute(f"{chart} polyline.line", "points").split()
        cx, cy = page.get_attribute(f"{chart} circle.last", "cx"), page.get_attribute(
            f"{chart} circle.last", "cy")
        assert points[-1] == f"{cx},{cy}"
        # the Spend page: spend per day by label, today's bar counting the closed tree
        run.close()
        page.goto(f"{http.base}/spend")
        page.wait_for_selector("svg.day-bars")
        today = page.locator("svg.day-bars g.day").last
        assert float(today.get_attribute("data-usd")) == 0.375
        assert page.console_errors == []
    coord.close()


def test_a_200_context_tree_is_short_and_biggest_spender_first(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "big-run", ceiling=50.0)
    kids = [run.spawn_child(max_cost_usd=1.0) for _ in range(200)]
    for i, kid in enumerate(kids[:40]):
        spend(kid, 0.001 * (i + 1))
    last = max(kids, key=lambda k: k.chain_id)  # read last of all, by id, by a tree walk
    spend(last, 0.0001)
    coord.store.flush()
    biggest = kids[39].chain_id
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/trees/big-run")
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 2 * 900, height
        first = page.locator('details[data-id="big-run"] > details.ctx').first
        assert first.get_attribute("data-id") == biggest
        assert "190 more" in page.inner_text('details[data-id="big-run"] > details.more > summary')
        # bars against the root's $50 ceiling; the child's own $1 ceiling marked at 2 %
        bar = first.locator("svg.bar rect.spend")
        assert float(bar.get_attribute("width")) == 0.08
        assert float(first.locator("svg.bar rect.own-limit").get_attribute("x")) == 1.4
        # recent calls: the newest of the whole tree, not of the first 100 contexts
        newest = page.locator("table.nodes tbody tr").first.locator("td.id").inner_text()
        assert newest == last.chain_id
    for kid in kids:
        kid.close()
    run.close()
    coord.close()


def _lines(page: Any, selector: str) -> int:
    """How many lines the text of an element takes."""
    return int(page.evaluate(
        "s => { const r = document.createRange();"
        " r.selectNodeContents(document.querySelector(s));"
        " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }",
        selector))


def test_layout_rules(redis_url: str, page: Any) -> None:
    """Plurals, thousands separators without wrapping, one time format (relative, the
    exact UTC time on hover), a stop detail that stays in its column, no toggle on a leaf,
    ids that do not break on /sessions, the user named on a 404, a viewer not sent to log
    in, no abort form on a stopped tree, no error in the console."""
    coord = coordinator(redis_url)
    run = open_tree(coord, "layout-run", ceiling=5.0)
    spend(run, 0.5, tokens=311_156, provider="openai")
    kid = run.spawn_child(max_cost_usd=1.0)
    spend(kid, 0.01)
    kid.abort("looping on the same ticket again and again " * 4)
    stopped = open_tree(coord, "stopped-run", ceiling=1.0)
    stopped.abort("done")
    coord.store.flush()
    now = datetime.now(timezone.utc)
    identity = ExecutionSessionIdentity(tenant_id="t1", conversation_id=str(uuid.uuid4()),
                                        path_id=str(uuid.uuid4()))
    SessionStore.for_coordinator(coord).save(
        identity, ExecutionSession(
            identity=identity,
            sandbox_id=str(uuid.uuid4()), provider="local", host="node-7", created_at=now,
            last_used_at=now, updated_at=now, expires_at=now + timedelta(minutes=30),
            status="active", ttl_ms=1_800_000, execution_count=3,
            total_execution_time_ms=1234, budget_root="layout-run"))
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        row = 'tr[data-id="layout-run"]'
        page.wait_for_selector(row)
        cells = page.inner_text(row)
        assert "311,156 / 155,578" in cells and "1 call" not in cells  # 2 calls
        assert _lines(page, f"{row} td.num") == 1
        page.goto(f"{http.base}/trees/layout-run")
        kid_summary = f'details[data-id="{kid.chain_id}"] > summary'
        assert page.inner_text(f"{kid_summary} .calls") == "1 call"
        # the long stop detail wraps inside the summary, right of the toggle column
        detail_x = page.evaluate(
            "s => document.querySelector(s).getBoundingClientRect().left",
            f"{kid_summary} .detail")
        link_x = page.evaluate(
            "s => document.querySelector(s).getBoundingClientRect().left",
            f"{kid_summary} .ctx-link")
        assert detail_x >= link_x - 1
        # a leaf has no toggle; a context with children has one
        marker = "s => getComputedStyle(document.querySelector(s), '::before').content"
        assert page.evaluate(marker, kid_summary) in ('""', "none", "")
        assert page.evaluate(marker, 'details[data-id="layout-run"] > summary') not in (
            '""', "none", "")
        # one time format: how long ago, the exact time (UTC) on hover
        for cell in page.locator("table.events time").all():
            assert cell.inner_text().endswith(" ago")
            assert cell.get_attribute("title").endswith(" UTC")
        assert page.locator("table.nodes time").count() >= 1
        # a viewer is told who they are, not to log in; no abort form on a stopped tree
        assert "log in" not in page.inner_text("section.abort")
        page.goto(f"{http.base}/trees/stopped-run")
        assert page.locator("section.abort form").count() == 0
        assert "nothing to abort" in page.inner_text("section.abort")
        assert page.console_errors == []  # no resource missing (a favicon), no script error
        # a 404 page for a logged-in user names them and offers no "log in"
        page.goto(f"{http.base}/trees/no-such-tree")
        page.console_errors.clear()  # (that page's own 404)
        header = page.inner_text("header")
        assert "victor" in header and "log in" not in header
        # ids on /sessions stay on one line each
        page.goto(f"{http.base}/sessions")
        cells = page.locator("table.sessions td.id").count()
        assert cells == 4
        for nth in range(1, cells + 1):
            selector = f"table.sessions tbody tr > td.id >> nth={nth - 1}"
            text = page.locator(selector)
            lines = text.evaluate(
                "e => { const r = document.createRange(); r.selectNodeContents(e);"
                " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }")
            assert lines == 1, text.inner_text()
        assert page.console_errors == []
    run.close()
    stopped.close()
    coord.close()
