"""The Spend page lists the day's spend by provider and model in USD, summing to the
total (Playwright driving Debian's Chromium against the dashboard under uvicorn)."""

from __future__ import annotations

from typing import Any

from tests.support.browser import browser_fixture, login, page_fixture  # noqa: F401 (fixtures)
from tests.support.dashboard_server import coordinator, dashboard
from tests.support.spend_models_setup import EXPECTED, TOTAL_MICRO, close_trees


def test_the_spend_page_shows_spend_by_provider_and_model(redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    close_trees(coord)
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/spend")
        cells = page.eval_on_selector_all(
            "table.spend tbody tr",
            "rows => rows.map(r => [...r.cells].slice(0, 3).map(c => c.innerText.trim()))")
        shown = {value: closed for label, value, closed in cells if label == "model"}
        assert shown == {field: f"${micro / 1e6:.4f}" for field, micro in EXPECTED.items()}
        total = next(closed for label, _, closed in cells if label == "total")
        assert total == f"${TOTAL_MICRO / 1e6:.4f}"
        assert page.console_errors == []
    coord.close()
