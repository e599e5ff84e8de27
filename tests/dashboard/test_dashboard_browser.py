"""The dashboard in a real browser (Playwright driving Debian's Chromium) against the
dashboard under uvicorn and a Redis the test started: live updates without reload, the
operator's abort reaching another process, refusals, escaping; screenshots for the docs."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator import ExecutionContext
from tests.support.dashboard_server import (
    Http,
    coordinator,
    dashboard,
    open_tree,
    spend,
    spend_steps,
    spend_until_stopped,
)

CHROMIUM = os.environ.get("BUDGET_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -e '.[test]')")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM} "
                "(apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.set_default_timeout(10_000)
    yield p
    context.close()


def _login(page: Any, http: Http, user: str, password: str) -> None:
    page.goto(http.base + "/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Open trees')")


def _spend_width(page: Any, tree: str) -> float:
    return float(page.get_attribute(f'tr[data-id="{tree}"] rect.spend', "width"))


def test_new_tree_appears_and_spend_from_another_process_moves_the_bar(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    first = open_tree(coord, "first-run", ceiling=1.0)
    spend(first, 0.1)
    coord.store.flush()
    with dashboard(redis_url) as http:
        _login(page, http, "victor", "victor-pw")
        page.wait_for_selector('tr[data-id="first-run"]')
        # a tree created now appears without a reload
        second = open_tree(coord, "second-run", ceiling=2.0, team="writers")
        spend(second, 0.2)
        coord.store.flush()
        page.wait_for_selector('tr[data-id="second-run"]', timeout=5_000)
        assert _spend_width(page, "first-run") == pytest.approx(10.0)
        # spend made by another OS process moves the bar within 2 s, without a reload
        page.evaluate("window.__same_document = true")
        proc = multiprocessing.get_context("spawn").Process(
            target=spend_steps, args=(redis_url, first.token, [0.3], 0.0))
        proc.start()
        proc.join(30)
        assert proc.exitcode == 0
        landed = time.monotonic()
        # (polled from here: the page's CSP forbids the eval that wait_for_function uses)
        while _spend_width(page, "first-run") != pytest.approx(40.0):
            assert time.monotonic() - landed < 2.0, "the bar did not move within 2 s"
            page.wait_for_timeout(50)
        assert page.evaluate("window.__same_document") is True  # no reload happened
    first.close()
    second.close()
    coord.close()


def test_operator_aborts_from_the_tree_page_and_the_other_process_stops(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "abort-run", ceiling=5.0)
    worker = root.spawn_child(max_cost_usd=1.0)
    spend(worker, 0.01)
    coord.store.flush()
    mp = multiprocessing.get_context("spawn")
    ready, out = mp.Event(), mp.Queue()
    proc = mp.Process(target=spend_until_stopped, args=(redis_url, worker.token, ready, out))
    proc.start()
    try:
        assert ready.wait(30)
        with dashboard(redis_url) as http:
            _login(page, http, "olga", "olga-pw")
            page.goto(f"{http.base}/trees/abort-run")
            page.fill("input[name=reason]", "runaway agent <b>loop</b>")
            page.click("button.danger")
            page.wait_for_selector(".flash")
            result = out.get(timeout=10)
            assert result["stop"] == "aborted" and result["calls"] > 0
            text = page.inner_text("main")
            assert "aborted by olga: runaway agent <b>loop</b>" in text  # escaped, shown
            page.wait_for_selector(f'details[data-id="{worker.chain_id}"].stopped')
            assert "runaway agent <b>loop</b> (by olga via dashboard)" in page.inner_text(
                f'details[data-id="{worker.chain_id}"] > summary')
            events = page.inner_text("table.events")
            assert "operator_abort" in events and "olga" in events
    finally:
        proc.join(10)
    snap = ExecutionContext.load_snapshot("abort-run", coord)
    assert snap.status == "stopped" and snap.abort_reason == "aborted"
    root.close()
    coord.close()


def test_abort_without_login_or_as_viewer_is_refused_and_nothing_changes(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "guarded-run")
    coord.store.flush()
    with dashboard(redis_url) as http:
        # not logged in: the page sends to the login form; a forged POST is refused
        page.goto(f"{http.base}/trees/guarded-run")
        assert "/login" in page.url
        resp = page.request.post(f"{http.base}/trees/guarded-run/abort",
                                 form={"reason": "x"}, max_redirects=0)
        assert resp.status in (303, 401)
        # a viewer sees no abort form, and a POST with the viewer's own CSRF token is 403
        _login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/trees/guarded-run")
        assert page.locator("button.danger").count() == 0
        assert "needs an operator" in page.inner_text("section.abort")
        csrf = page.get_attribute("form.inline input[name=csrf]", "value")
        resp = page.request.post(f"{http.base}/trees/guarded-run/abort",
                                 form={"reason": "x", "csrf": csrf}, max_redirects=0)
        assert resp.status == 403
    snap = ExecutionContext.load_snapshot("guarded-run", coord)
    assert snap.status == "running" and not any(
        e.event_type in ("aborted", "operator_abort") for e in snap.events)
    root.close()
    coord.close()


def test_a_script_in_a_label_does_not_run(redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    evil = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned=2\">"
    root = open_tree(coord, "xss-run", team=evil, service="<svg onload=alert(1)>")
    spend(root, 0.05)
    coord.store.flush()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with dashboard(redis_url) as http:
        _login(page, http, "victor", "victor-pw")
        page.wait_for_selector('tr[data-id="xss-run"]')
        assert evil in page.inner_text('tr[data-id="xss-run"] .labels')
        page.goto(f"{http.base}/trees/xss-run")
        assert evil in page.inner_text("details[data-id='xss-run'] > summary")
        page.wait_for_timeout(500)
        assert page.evaluate("window.__pwned") is None
        assert dialogs == []
    root.close()
    coord.close()


def test_screenshots_for_the_docs(redis_url: str, page: Any, tmp_path: Path) -> None:
    """A realistic set of trees; the overview and a tree page saved as PNG files (to
    docs/img/ with BUDGET_DASHBOARD_SCREENSHOTS=1, which is how the docs' are made)."""
    out = DOCS_IMG if os.environ.get("BUDGET_DASHBOARD_SCREENSHOTS") == "1" else tmp_path
    coord = coordinator(redis_url)
    trees = []
    for name, team, service, ceiling, spent in (
            ("support-bot-7f3a", "support", "triage", 5.0, 4.2),
            ("research-42c1", "research", "deep-research", 20.0, 6.5),
            ("codegen-19be", "platform", "codegen", 2.0, 0.35),
            ("nightly-eval-0d2e", "ml", "eval", 50.0, 31.0)):
        ctx = open_tree(coord, name, ceiling=ceiling, team=team, service=service)
        spend(ctx, spent * 0.6, tokens=48_000, provider="openai", operation="plan")
        kid = ctx.spawn_child(max_cost_usd=ceiling / 2)
        spend(kid, spent * 0.4, tokens=21_000, provider="anthropic", operation="search")
        kid.spawn_child(max_cost_usd=ceiling / 10)
        trees.append(ctx)
    trees[0].spawn_child(max_cost_usd=0.5).abort("looping on the same ticket")
    coord.store.flush()
    with dashboard(redis_url) as http:
        _login(page, http, "olga", "olga-pw")
        page.wait_for_selector('tr[data-id="nightly-eval-0d2e"]')
        page.wait_for_timeout(3000)  # burn rates need a few seconds of history
        page.reload()
        page.wait_for_selector('tr[data-id="nightly-eval-0d2e"]')
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "dashboard-overview.png"))
        page.goto(f"{http.base}/trees/support-bot-7f3a")
        page.wait_for_selector("details.stopped")
        page.screenshot(path=str(out / "dashboard-tree.png"), full_page=True)
    assert (out / "dashboard-overview.png").stat().st_size > 10_000
    assert (out / "dashboard-tree.png").stat().st_size > 10_000
    for ctx in trees:
        ctx.close()
    coord.close()
