"""The tree page and ``GET /api/trees/{id}`` show what the budget's edge did: each
context's degraded calls (subtree included), a degraded call's model as the one that ran
with the one asked for (``degraded_from``), the refusals of a final reserve folded by
reason, and the ``degraded`` and ``budget_warning`` events (the dashboard in its own
process; the page in Chromium, driven by Playwright, when it is installed)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator import Coordinator, ExecutionContext
from tests.support.dashboard_server import dashboard
from tests.support.degrade import edge_tree

EDGE = ("degraded", "budget_warning", "final_reserve")
"""The events of the budget's edge (the dashboard's alerts add budget_alert ones)."""


@pytest.fixture
def tree(coord: Coordinator) -> Iterator[tuple[ExecutionContext, ExecutionContext]]:
    """edge_tree's root and child, made before any page runs an event loop here."""
    root, kid = edge_tree(coord)
    yield root, kid
    with ThreadPoolExecutor(1) as pool:  # off the loop a page may have left running
        pool.submit(lambda: (kid.close(), root.close())).result()


@pytest.fixture
def page() -> Iterator[Any]:
    """A Chromium page (tests/support/browser.py: the test skips where there is none)."""
    browser = importlib.import_module("tests.support.browser")
    with browser.sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=browser.CHROMIUM, args=browser.ARGS)
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        p = context.new_page()
        p.set_default_timeout(10_000)
        errors: list[str] = []
        p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        p.console_errors = errors
        yield p
        context.close()
        chromium.close()


def test_the_api_carries_degraded_calls_and_degraded_from(
        redis_url: str, tree: tuple[ExecutionContext, ExecutionContext]) -> None:
    _, kid = tree
    with dashboard(redis_url) as http:
        data = http.json("/api/trees/edge-tree")
    contexts = data["contexts"]
    assert (contexts["edge-tree"]["degraded_calls"], contexts[kid.chain_id]["degraded_calls"]
            ) == (2, 1)
    assert contexts[kid.chain_id]["refused_text"] == "3 refused: final_reserve"
    ran = sorted((n["context"], n["model"], n["degraded_from"] or "") for n in data["nodes"]
                 if n["model"])
    assert ran == sorted([(kid.chain_id, "gpt-4o-mini", "gpt-4o"),
                          ("edge-tree", "gpt-4o-mini", "gpt-4o"),
                          *[("edge-tree", "gpt-4o", "")] * 5])
    assert all(n["degraded_from"] is None for n in data["nodes"] if n["model"] != "gpt-4o-mini")
    (fold,) = [r for r in data["call_rows"] if r["fold"]]
    assert (fold["fold"], fold["context"]) == ("3 refused: final_reserve", kid.chain_id)
    said = sorted((e["context"], e["event_type"], e["reason"]) for e in data["events"]
                  if e["event_type"] in EDGE)
    assert said == sorted([
        ("edge-tree", "budget_warning", "spend reached 50% of max_cost_usd ($0.05 of $0.10)"),
        ("edge-tree", "degraded", "ran on gpt-4o-mini instead of gpt-4o (model ladder)"),
        (kid.chain_id, "degraded", "ran on gpt-4o-mini instead of gpt-4o (model ladder)"),
        (kid.chain_id, "final_reserve", "usd needs $0.002, $0.00 of $0.10 left before the "
                                        "final reserve of $0.03")])


def test_the_tree_page_shows_degraded_calls_and_the_model_they_ran_on(
        redis_url: str, tree: tuple[ExecutionContext, ExecutionContext], page: Any) -> None:
    from tests.support.browser import login

    _, kid = tree
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/trees/edge-tree")
        root_summary = page.locator('details[data-id="edge-tree"] > summary')
        kid_summary = page.locator(f'details[data-id="{kid.chain_id}"] > summary')
        assert root_summary.locator(".degraded").inner_text() == "2 degraded"
        assert kid_summary.locator(".degraded").inner_text() == "1 degraded"
        assert kid_summary.locator(".refused").inner_text() == "3 refused: final_reserve"
        rows = page.locator("table.nodes:not(.more) tbody tr")
        assert "3 refused: final_reserve" in rows.first.inner_text()
        models = page.locator("table.nodes td.model").all_text_contents()  # "more" too
        assert sorted(models) == ["", "", "", *["gpt-4o"] * 5, *["gpt-4o-mini (from gpt-4o)"] * 2]
        assert page.locator("td.model .degraded-from").first.get_attribute("title") == (
            "its model ladder ran it on gpt-4o-mini instead")
        kinds = page.locator("table.events tbody tr td:nth-child(3)").all_text_contents()
        assert sorted(k for k in kinds if k in EDGE) == [
            "budget_warning", "degraded", "final_reserve"]
        degraded = page.locator("tr.event.degraded").inner_text()  # one line, 2 contexts
        assert "2 contexts" in degraded and "(2 times)" in degraded, degraded
        warning = page.locator("tr.event.budget_warning td.reason").inner_text()
        assert warning == "spend reached 50% of max_cost_usd ($0.05 of $0.10)"
        assert page.console_errors == []
