"""The dashboard's Quotas page in a real browser: each bucket's bars (spent, held in
grants), its last windows, and the trees drawing from it now."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.quotas import QuotaRule, Quotas
from tests.support.quota_procs import labelled

pytest.importorskip("starlette")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = os.environ.get("BUDGET_TEST_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM}", allow_module_level=True)

from tests.support.dashboard_server import VIEWER_TOKEN, dashboard  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        p = context.new_page()
        p.set_default_timeout(10_000)
        yield p
        browser.close()


def _spend(coord: Coordinator, usd: float, *, close: bool) -> ExecutionContext:
    ctx = ExecutionContext(CONFIG, metadata=labelled("ann"), coordinator=coord)
    assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd)) == Decision.ALLOW
    if close:
        ctx.close()
    return ctx


def test_quotas_page_shows_bars_history_and_trees(coord: Coordinator, redis_url: str,
                                                  page: Any) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=0.10), actor="t")
    with ThreadPoolExecutor(1) as pool:  # (Playwright runs an event loop on this thread)
        pool.submit(_spend, coord, 0.04, close=True).result()
        running = pool.submit(_spend, coord, 0.01, close=False).result()
    with dashboard(redis_url) as http:
        page.set_extra_http_headers({"Authorization": f"Bearer {VIEWER_TOKEN}"})
        page.goto(http.base + "/quotas")
        row = 'tr.quota[data-rule="user-day"][data-bucket="user=ann"]'
        page.wait_for_selector(row)
        spent = float(page.get_attribute(f"{row} .quota-bar rect.spend", "width"))
        held = float(page.get_attribute(f"{row} .quota-bar rect.held", "width"))
        assert spent == pytest.approx(40.0)  # the closed tree's $0.04 of $0.10
        assert held > 0  # the running tree's grant
        assert page.locator(f"{row} a", has_text=running.chain_id).count() == 1
        assert page.locator(f"{row} svg.history rect").count() == 1  # today's window
        page.click("nav a:has-text('Quotas')")
        page.wait_for_selector(row)
    running.close()


def _login(page: Any, base: str, user: str, password: str) -> None:
    page.goto(base + "/login?next=/quotas")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", password)
    page.click("form:has(input[name=password]) button[type=submit]")
    page.wait_for_selector("h1:has-text('Quotas')")


def test_an_operator_creates_changes_and_deletes_a_rule_from_the_page(
        coord: Coordinator, redis_url: str, page: Any) -> None:
    with dashboard(redis_url) as http:
        _login(page, http.base, "olga", "olga-pw")
        new = "form.rule-new"
        page.fill(f"{new} input[name=id]", "user-day")
        page.fill(f"{new} input[name=match]", "team=research, user=*")
        page.fill(f"{new} input[name=usd]", "0.02")
        page.click(f"{new} button[type=submit]")
        page.wait_for_selector("p.flash:has-text('quota user-day set by olga (version 1)')")
        rule = Quotas(coord).get("user-day")
        assert (rule.match, rule.usd, rule.calls) == ({"team": "research", "user": "*"},
                                                      0.02, None)

        edit = 'tr.rule[data-rule="user-day"] form.rule-edit'
        assert page.input_value(f"{edit} input[name=usd]") == "0.02"
        page.fill(f"{edit} input[name=usd]", "0.05")
        page.fill(f"{edit} input[name=calls]", "40")
        page.click(f"{edit} button[type=submit]")
        page.wait_for_selector("p.flash:has-text('version 2')")
        rule = Quotas(coord).get("user-day")
        assert (rule.usd, rule.calls, rule.version) == (0.05, 40, 2)
        assert Quotas(coord).audit("user-day")[-1]["actor"] == "olga (dashboard)"

        page.fill(f"{edit} input[name=usd]", "lots")  # refused with its reason
        page.click(f"{edit} button[type=submit]")
        assert "usd" in page.inner_text("main") and "must be a number" in page.content()
        assert Quotas(coord).get("user-day").version == 2

        page.goto(http.base + "/quotas")
        page.click('tr.rule[data-rule="user-day"] form.rule-delete button')
        page.wait_for_selector("p.flash:has-text('quota user-day deleted by olga')")
        assert Quotas(coord).rules() == []


def test_a_viewer_sees_rules_but_no_forms(coord: Coordinator, redis_url: str,
                                          page: Any) -> None:
    Quotas(coord).set(QuotaRule(id="team-day", match={"team": "research"}, usd=5.0),
                      actor="t")
    with dashboard(redis_url) as http:
        _login(page, http.base, "victor", "victor-pw")
        assert page.inner_text('tr.rule[data-rule="team-day"]').split("\t")[:3] == [
            "team-day", "team=research", "5.0"]
        assert page.locator("form.rule-edit, form.rule-new, form.rule-delete").count() == 0
        assert "needs an operator" in page.inner_text("main")
