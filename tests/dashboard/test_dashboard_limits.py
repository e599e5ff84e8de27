"""``PUT /api/trees/{id}/limits`` against the dashboard under uvicorn and a real Redis: an
operator raises a ceiling that stopped a tree (the stop lifted where the tree runs, the
change audited under the operator's name); viewers, sessions without the CSRF token, bad
values, unknown ids and closed trees change nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from coordinator import Decision, ExecutionContext
from coordinator.runtime.coordinator import Coordinator
from tests.dashboard.test_dashboard_api import _login
from tests.support.dashboard_server import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    coordinator,
    dashboard,
    open_tree,
    spend,
)

pytest.importorskip("starlette")

BAD_BODIES: list[Any] = [
    {"max_cost_usd": "nan"}, {"max_cost_usd": float("nan")}, {"max_cost_usd": "-1"},
    {"max_cost_usd": -1}, {"max_cost_usd": "0x10"}, {"max_cost_usd": "1e400"},
    {"max_cost_usd": float("inf")}, {"max_cost_usd": "1e2"}, {"max_cost_usd": "two"},
    {"max_cost_usd": True}, {"max_cost_usd": "0"}, {"max_cost_usd": "2000000000"},
    {"max_cost_usd": {"usd": 1}}, {"max_steps": "1.5"}, {"max_steps": 0},
    {"max_retries_total": "-2"}, {"token_budget": "1e3"}, {"bogus": 1}, {},
]
"""Each with a reason (so that the value is what is refused)."""


def _limits_changed(coord: Coordinator, ctx_id: str) -> list[dict[str, Any]]:
    return [dict(e.metadata) for e in ExecutionContext.load_snapshot(ctx_id, coord).events
            if e.event_type == "limits_changed"]


def _stopped_at_ceiling(coord: Coordinator, ctx_id: str) -> ExecutionContext:
    root = open_tree(coord, ctx_id, ceiling=0.05)
    assert spend(root, 0.05) == Decision.ALLOW
    assert spend(root, 0.01) == Decision.HALT
    coord.store.flush()
    assert ExecutionContext.load_snapshot(ctx_id, coord).abort_reason == "budget_exceeded"
    return root


def test_an_operator_raises_a_ceiling_and_the_stop_is_lifted(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = _stopped_at_ceiling(coord, "raise-run")
    with dashboard(redis_url) as http:
        status, _, body = http.request("PUT", "/api/trees/raise-run/limits",
                                       token=OPERATOR_TOKEN,
                                       body={"max_cost_usd": "0.10", "reason": "approved"})
        assert status == 200, body
        assert json.loads(body) == {
            "ctx_id": "raise-run", "actor": "token-1 (dashboard)", "reason": "approved",
            "changes": [{"limit": "max_cost_usd", "before": 0.05, "after": 0.1}],
            "lifted": ["budget_exceeded"], "stopped": False, "stop_reason": None,
            "by": "token-1"}
        # the process that runs the tree hears the lift and calls again under $0.10
        deadline = time.monotonic() + 2.0
        while root.stop_reason is not None:
            assert time.monotonic() < deadline, "the lift was not heard within 2 s"
            time.sleep(0.01)
        assert spend(root, 0.04) == Decision.ALLOW
        coord.store.flush()
        [change] = _limits_changed(coord, "raise-run")
        assert change["actor"] == "token-1 (dashboard)" and change["reason"] == "approved"
        assert change["limits"] == {"usd": {"before": 50_000, "after": 100_000}}
        # the API's tree shows it running, and the event with who made it
        data = http.json("/api/trees/raise-run", token=VIEWER_TOKEN)
        assert data["contexts"]["raise-run"]["status"] == "running"
        assert any(e["event_type"] == "limits_changed" and e["actor"] == "token-1 (dashboard)"
                   for e in data["events"])
        # steps and tokens too; a ceiling at or below the spend stops the tree at once
        status, _, body = http.request("PUT", "/api/trees/raise-run/limits",
                                       token=OPERATOR_TOKEN,
                                       body={"max_cost_usd": 0.08, "max_steps": 50,
                                             "token_budget": 5000, "reason": "enough"})
        assert status == 200, body
        done = json.loads(body)
        assert [c["limit"] for c in done["changes"]] == [
            "max_cost_usd", "max_steps", "token_budget.total"]
        assert done["stopped"] is True and done["stop_reason"] == "budget_exceeded"
    root.close()
    coord.close()


def test_viewers_missing_csrf_bad_values_unknown_and_closed_change_nothing(
        redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = _stopped_at_ceiling(coord, "guarded-limits")
    done = open_tree(coord, "closed-run")
    done.close()
    coord.store.flush()
    path = "/api/trees/guarded-limits/limits"
    raise_it = {"max_cost_usd": "1.00", "reason": "more"}
    with dashboard(redis_url) as http:
        assert http.request("PUT", path, body=raise_it)[0] == 401
        status, _, body = http.request("PUT", path, token=VIEWER_TOKEN, body=raise_it)
        assert status == 403 and "needs an operator" in body
        cookie, csrf = _login(http, "olga", "olga-pw")
        assert http.request("PUT", path, headers={"Cookie": cookie}, body=raise_it)[0] == 403
        assert http.request("PUT", path, headers={"Cookie": cookie, "X-CSRF-Token": "forged"},
                            body=raise_it)[0] == 403
        viewer_cookie, viewer_csrf = _login(http, "victor", "victor-pw")
        assert http.request("PUT", path, body=raise_it, headers={
            "Cookie": viewer_cookie, "X-CSRF-Token": viewer_csrf})[0] == 403
        for bad in BAD_BODIES:
            status, _, text = http.request("PUT", path, token=OPERATOR_TOKEN,
                                           body={**bad, "reason": "typo"})
            assert status == 400, (bad, status, text)
            assert json.loads(text)["error"], bad
        for bad_body in ({"max_cost_usd": "1.00"}, {"max_cost_usd": "1.00", "reason": " "},
                         ["max_cost_usd", "1.00"]):
            assert http.request("PUT", path, token=OPERATOR_TOKEN, body=bad_body)[0] == 400
        status, _, text = http.request("PUT", "/api/trees/no-such-run/limits",
                                       token=OPERATOR_TOKEN, body=raise_it)
        assert status == 404 and "no-such-run" in json.loads(text)["error"]
        status, _, text = http.request("PUT", "/api/trees/closed-run/limits",
                                       token=OPERATOR_TOKEN, body=raise_it)
        assert status == 409 and "is closed" in json.loads(text)["error"]
        snap = ExecutionContext.load_snapshot("guarded-limits", coord)
        assert snap.status == "stopped" and snap.max_cost_usd == pytest.approx(0.05)
        assert _limits_changed(coord, "guarded-limits") == []
        assert _limits_changed(coord, "closed-run") == []
        # the session with its CSRF token is allowed
        status, _, text = http.request("PUT", path, body=raise_it, headers={
            "Cookie": cookie, "X-CSRF-Token": csrf})
        assert status == 200, text
        assert json.loads(text)["actor"] == "olga (dashboard)"
    root.close()
    coord.close()
