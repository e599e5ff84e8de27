"""The dashboard's abort of a context its ceiling stopped: allowed (the stop becomes
``aborted``, so a later raise cannot lift it), as ``budgetctl abort``; a context aborted,
timed out or closed is still a 409 that changes nothing."""

from __future__ import annotations

import json

import pytest

from coordinator import Decision, ExecutionContext
from tests.support.dashboard_server import OPERATOR_TOKEN, coordinator, dashboard, open_tree, spend

pytest.importorskip("starlette")


def test_abort_of_a_ceiling_stop_makes_it_final(redis_url: str) -> None:
    coord = coordinator(redis_url)
    run = open_tree(coord, "ceiling-abort", ceiling=0.05)
    assert spend(run, 0.05) == Decision.ALLOW
    assert spend(run, 0.01) == Decision.HALT
    closed = open_tree(coord, "closed-abort")
    closed.close()
    coord.store.flush()
    assert ExecutionContext.load_snapshot("ceiling-abort", coord).abort_reason == (
        "budget_exceeded")
    with dashboard(redis_url) as http:
        page = http.request("GET", "/trees/ceiling-abort", token=OPERATOR_TOKEN)[2]
        assert 'class="danger">abort</button>' in page and "nothing to abort" not in page
        status, _, body = http.request("POST", "/api/trees/ceiling-abort/abort",
                                       token=OPERATOR_TOKEN, body={"reason": "over budget"})
        assert status == 200 and json.loads(body)["status"] == "aborted", body
        snap = ExecutionContext.load_snapshot("ceiling-abort", coord)
        assert snap.status == "stopped" and snap.abort_reason == "aborted"
        # a raise now lifts nothing: the abort stays
        done = coord.set_limits("ceiling-abort", max_cost_usd=1.0, actor="olga", reason="more")
        assert not done.lifted and done.stop_reason == "aborted"
        page = http.request("GET", "/trees/ceiling-abort", token=OPERATOR_TOKEN)[2]
        assert "nothing to abort" in page
        # aborted or closed: still 409, no second operator_abort
        for ctx_id, said in (("ceiling-abort", "already stopped (aborted)"),
                             ("closed-abort", "already closed")):
            status, _, body = http.request("POST", f"/api/trees/{ctx_id}/abort",
                                           token=OPERATOR_TOKEN, body={"reason": "again"})
            assert status == 409 and said in body, body
        events = ExecutionContext.load_snapshot("ceiling-abort", coord).events
        assert [e.event_type for e in events].count("operator_abort") == 1
    run.close()
    coord.close()
