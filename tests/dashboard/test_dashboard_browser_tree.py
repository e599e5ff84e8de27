"""The tree page of a big, busy tree stays short (at 1400 x 900, under two viewport
heights): recent calls and events folded to the newest ten behind "N more", refusals
folded into one line each ("37 refused: aborted") so that $0 refusals do not push out
the calls that cost money (Playwright driving Debian's Chromium)."""

from __future__ import annotations

import json
from typing import Any

from coordinator import Decision, SafetyEvent
from tests.support.browser import browser_fixture, login, page_fixture  # noqa: F401 (fixtures)
from tests.support.dashboard_server import coordinator, dashboard, open_tree, spend


def test_a_busy_200_context_tree_is_short_and_shows_the_calls_that_cost(
        redis_url: str, page: Any) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "busy-run", ceiling=50.0)
    kids = [run.spawn_child(max_cost_usd=1.0) for _ in range(200)]
    for i, kid in enumerate(kids):
        assert spend(kid, 0.001 * (i + 1)) == Decision.ALLOW
        kid.record_event(SafetyEvent(event_type="custom", decision=Decision.ALLOW,
                                     hook="test", reason=f"checked step {i}"))
    run.abort("aborted by the test")
    for kid in kids[:37]:  # refused: $0 each
        assert spend(kid, 0.01) == Decision.HALT
    coord.store.flush()  # every record of the refusals lands before the page is read
    # A kid that heard the abort over pub/sub refuses on its own, one that had not yet
    # is refused by Redis: which one happens is a race (a loaded machine loses it for
    # the first few kids), and both must record the same words, or the page would show
    # one stop as two lines ("28 contexts" and "9 contexts").
    refusals = [json.loads(e) for kid in kids[:37]
                for e in coord.store.client.lrange(
                    coord.store.ks.events(run.root_id, kid.chain_id), 0, -1)
                if json.loads(e).get("event_type") == "aborted"]
    assert len(refusals) == 37
    assert {(e["reason"], e["decision"]) for e in refusals} == {("stopped: aborted", "HALT")}
    with dashboard(redis_url) as http:
        login(page, http, "victor", "victor-pw")
        page.goto(f"{http.base}/trees/busy-run")
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 2 * 900, height
        # the 37 refusals are one line; the calls that cost money follow it
        rows = page.locator("table.nodes:not(.more) tbody tr")
        assert rows.count() == 10
        assert "37 refused: aborted" in rows.first.inner_text()
        assert "37 contexts" in rows.first.inner_text()
        costs = [rows.nth(i).locator("td.num").first.inner_text() for i in range(1, 10)]
        assert all(c.startswith("$0.") and c != "$0.0000" for c in costs), costs
        assert page.inner_text('details[data-id="more-calls"] > summary') == "4 more calls"
        # the stop that 37 contexts recorded is one line among the events
        first_event = page.locator("table.events:not(.more) tbody tr").first.inner_text()
        assert "37 contexts" in first_event and "(37 times)" in first_event
        assert page.locator("table.events:not(.more) tbody tr").count() == 10
        assert page.console_errors == []
    for kid in kids:
        kid.close()
    run.close()
    coord.close()
