"""The tree page's ceiling form in a real browser (Playwright driving Debian's Chromium):
an operator logs in and raises the ceiling that stopped a tree, the stop is lifted where
the tree runs and the page shows the change and its event; a viewer has no form, and a
POST with the viewer's own CSRF token changes nothing."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Decision, ExecutionContext
from tests.support.browser import browser_fixture, login, page_fixture  # noqa: F401 (fixtures)
from tests.support.dashboard_server import coordinator, dashboard, open_tree, spend


def test_an_operator_raises_the_ceiling_from_the_tree_page(redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "page-raise", ceiling=0.05)
    assert spend(root, 0.05) == Decision.ALLOW
    assert spend(root, 0.01) == Decision.HALT
    coord.store.flush()
    with dashboard(redis_url) as http:
        login(page, http, "olga", "olga-pw")
        page.goto(f"{http.base}/trees/page-raise")
        assert "$0.05" in page.inner_text("section.limits h2")
        page.fill("section.limits input[name=max_cost_usd]", "0.10")
        page.fill("section.limits input[name=reason]", "approved <b>by finance</b>")
        page.click("section.limits button[type=submit]")
        flash = page.inner_text(".flash")
        assert "page-raise: max_cost_usd $0.05 -> $0.10" in flash
        assert "lifted budget_exceeded: running again" in flash
        assert "by olga (dashboard): approved <b>by finance</b>" in flash  # escaped, shown
        assert page.inner_text('details[data-id="page-raise"] > summary .status') == "running"
        events = page.inner_text("table.events")
        assert "limits_changed" in events and "olga (dashboard)" in events
        deadline = time.monotonic() + 2.0
        while root.stop_reason is not None:  # the running process heard the lift
            assert time.monotonic() < deadline, "the lift was not heard within 2 s"
            time.sleep(0.01)
        assert spend(root, 0.04) == Decision.ALLOW
        assert page.console_errors == []
    root.close()
    coord.close()


def test_a_viewer_has_no_ceiling_form(redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "page-viewer", ceiling=0.05)
    coord.store.flush()
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/trees/page-viewer")
        assert page.locator("section.limits").count() == 0
        assert page.locator("input[name=max_cost_usd]").count() == 0
        csrf = page.get_attribute("form.inline input[name=csrf]", "value")
        resp = page.request.post(f"{http.base}/trees/page-viewer/limits", max_redirects=0,
                                 form={"max_cost_usd": "1.00", "reason": "x", "csrf": csrf})
        assert resp.status == 403
    snap = ExecutionContext.load_snapshot("page-viewer", coord)
    assert snap.max_cost_usd == 0.05
    assert not any(e.event_type == "limits_changed" for e in snap.events)
    root.close()
    coord.close()
