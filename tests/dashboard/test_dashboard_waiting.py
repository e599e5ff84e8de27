"""Trees waiting for approval on the dashboard (the root hash's approval_ctx,
approval_reason, approval_until_ms, written here with HSET as a waiting call does): the
overview's state and its ``state=waiting`` filter, the tree page's banner, the /metrics
gauges, and one
``approval_needed`` alert per waiting context and stop to the webhooks (a raise reached
again is a new stop), however many dashboards watch."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from coordinator import Decision
from coordinator.runtime.coordinator import Coordinator
from tests.support.dashboard_server import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    WebhookReceiver,
    coordinator,
    dashboard,
    open_tree,
    spend,
)
from tests.support.waiting import until

pytest.importorskip("starlette")


def _wait_for(coord: Coordinator, root: str, ctx: str, reason: str = "budget_exceeded",
              seconds: int = 300) -> int:
    """Show ``root`` waiting, as approval.lua does; returns approval_until_ms."""
    end = int(coord.redis_now_ms()) + seconds * 1000
    coord.client.hset(coord.keyspace.ctx(root, root), mapping={
        "approval_ctx": ctx, "approval_reason": reason, "approval_until_ms": end})
    return end


def _stopped_tree(coord: Coordinator, name: str) -> Any:
    run = open_tree(coord, name, ceiling=0.05)
    assert spend(run, 0.05) == Decision.ALLOW
    assert spend(run, 0.01) == Decision.HALT
    return run


def test_overview_state_filter_and_metrics(redis_url: str) -> None:
    coord = coordinator(redis_url)
    waiting = _stopped_tree(coord, "wait-1")
    kid = waiting.spawn_child(max_cost_usd=0.01)
    calm = open_tree(coord, "calm-1")
    ended = open_tree(coord, "ended-1")
    coord.store.flush()
    end = _wait_for(coord, "wait-1", kid.chain_id)
    _wait_for(coord, "ended-1", "ended-1", seconds=-1)  # its end has passed
    with dashboard(redis_url) as http:
        got = http.json("/api/trees?state=waiting")
        assert got["state"] == "waiting" and got["total"] == 1
        [row] = got["trees"]
        assert row["id"] == "wait-1" and row["waiting_for_approval"] == {
            "ctx": kid.chain_id, "reason": "budget_exceeded", "until_ms": end}
        every = {t["id"]: t for t in http.json("/api/trees?sort=age")["trees"]}
        assert every["calm-1"]["waiting_for_approval"] is None
        assert every["ended-1"]["waiting_for_approval"] is None
        assert every["wait-1"]["waiting_for_approval"]["ctx"] == kid.chain_id
        assert http.json("/api/trees?state=waiting&label=team=other")["total"] == 0
        assert http.request("GET", "/api/trees?state=nope", token=VIEWER_TOKEN)[0] == 400
        status, _, page = http.request("GET", "/?state=waiting", token=VIEWER_TOKEN)
        assert status == 200 and "wait-1" in page and "calm-1" not in page
        assert '<option value="waiting" selected>' in page
        assert f'waiting for approval</span> (budget_exceeded at <code>{kid.chain_id}' in page
        tree_page = http.request("GET", f"/trees/{kid.chain_id}", token=VIEWER_TOKEN)[2]
        assert 'class="waiting">Waiting for approval</span>: a call of' in tree_page
        assert f"<code>{kid.chain_id}</code></a> met <b>budget_exceeded</b>" in tree_page
        assert "Waiting for approval" not in http.request("GET", "/trees/calm-1",
                                                          token=VIEWER_TOKEN)[2]
        body = http.request("GET", "/metrics", token=VIEWER_TOKEN)[2]
        assert 'budget_waiting_trees{tenant=""} 1.0' in body
        assert ('budget_waiting_trees_by_reason{reason="budget_exceeded",tenant=""} 1.0'
                in body)
        # the wait ends (the fields deleted): nothing waits
        coord.client.hdel(coord.keyspace.ctx("wait-1", "wait-1"), "approval_ctx",
                          "approval_reason", "approval_until_ms")
        time.sleep(1.2)  # the dashboard's read cache
        assert http.json("/api/trees?state=waiting")["total"] == 0
        assert 'budget_waiting_trees{tenant=""} 0.0' in http.request(
            "GET", "/metrics", token=OPERATOR_TOKEN)[2]
    for ctx in (kid, waiting, calm, ended):
        ctx.close()
    coord.close()


def test_one_approval_alert_per_context_and_stop(redis_url: str) -> None:
    coord = coordinator(redis_url)
    run = _stopped_tree(coord, "wait-alert")
    coord.store.flush()
    _wait_for(coord, "wait-alert", "wait-alert")
    env = {"BUDGET_DASHBOARD_URL": "https://ops.example/budget/"}
    with WebhookReceiver() as hook:
        env["BUDGET_ALERT_WEBHOOKS"] = hook.url
        with dashboard(redis_url, env=env), dashboard(redis_url, env=env):
            until(lambda: any(json.loads(b)["type"] == "approval_needed"
                              for _, b in hook.received), "approval alert", 60)
            time.sleep(3)  # three more sweeps: no repeat
            # raised, reached again and waiting again: a new stop, one more alert
            coord.set_limits("wait-alert", max_cost_usd=0.06, actor="olga", reason="ok")
            assert spend(run, 0.02) == Decision.HALT
            coord.store.flush()
            _wait_for(coord, "wait-alert", "wait-alert")
            until(lambda: sum(json.loads(b)["type"] == "approval_needed"
                              for _, b in hook.received) >= 2, "second approval alert", 60)
            time.sleep(3)
        received = [json.loads(b) for _, b in hook.received]
    approvals = [p for p in received if p["type"] == "approval_needed"]
    assert len(approvals) == 2, approvals
    first, second = approvals
    assert (first["root"], first["context"], first["reason"]) == (
        "wait-alert", "wait-alert", "budget_exceeded")
    assert first["limit"] == "max_cost_usd $0.05" and second["limit"] == "max_cost_usd $0.06"
    assert first["link"] == "https://ops.example/budget/trees/wait-alert?tenant="
    assert "waits for approval" in first["message"] and first["link"] in first["message"]
    assert first["labels"]["team"] == "research"
    events = coord.client.lrange(coord.keyspace.events("wait-alert", "wait-alert"), 0, -1)
    assert sum(json.loads(e)["event_type"] == "approval_needed" for e in events) == 2
    run.close()
    coord.close()
