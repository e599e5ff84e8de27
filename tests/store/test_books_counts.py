"""Counts add up (issue 25 item 9, issue 23 item 2): every call's outcome is counted in
Redis by the scripts that settle it, and snapshots, budgetctl and the dashboard show calls
run and calls refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from coordinator.core.keys import KeySpace
from tests.support.invariants import check_tree

# -- 9. counts add up ----------------------------------------------------------------------

async def _interrupted(ctx: ExecutionContext) -> Decision:
    async def slow() -> None:
        await asyncio.sleep(5)
    return await ctx.awrap_llm_call(slow, WrapOptions(timeout_ms=50,
                                                      cost_estimate_hint=0.001))


def test_every_outcome_is_counted_and_refusals_are_shown(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.1, max_steps=50,
                                            max_retries_total=5), coordinator=coord)
    child = root.spawn_child(max_cost_usd=0.01)
    assert child.wrap_llm_call(lambda: report_usage(cost_usd=0.002)) == Decision.ALLOW
    assert child.wrap_llm_call(lambda: 1 / 0) == Decision.RETRY
    assert asyncio.run(_interrupted(child)) == Decision.HALT
    for _ in range(3):  # does not fit: refused, the child keeps running
        assert child.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.05)) \
            == Decision.HALT
    coord.store.flush()
    snap = child.get_snapshot()
    assert snap.calls == {"ok": 1, "error": 1, "interrupted": 1, "refused": 3}
    assert snap.calls_run == 3
    assert snap.refusals == {"budget_exceeded": 3}
    assert snap.last_refusal == "budget_exceeded"
    # reported, failed without a report ($0), interrupted (its estimate)
    assert snap.cost_usd_accumulated == pytest.approx(0.002 + 0.001)
    assert (snap.step_count, snap.retries_used) == (2, 1)  # the interrupted one: a step
    top = root.get_snapshot()  # run calls roll up; refusals stay on their context
    assert top.calls == {"ok": 1, "error": 1, "interrupted": 1} and top.refusals == {}

    assert main(["--redis", redis_url, "tree", root.chain_id]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if child.chain_id in x)
    assert "3 calls" in line and line.endswith("running, 3 refused: budget_exceeded")
    assert main(["--redis", redis_url, "tree", root.chain_id, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["tree"]
    assert doc["calls"] == 3 and doc["calls_refused"] == 0
    (kid,) = doc["children"]
    assert (kid["calls"], kid["calls_refused"], kid["refusals"], kid["last_refusal"]) == (
        3, 3, {"budget_exceeded": 3}, "budget_exceeded")
    assert kid["call_outcomes"] == {"ok": 1, "error": 1, "interrupted": 1, "refused": 3}
    root.close()
    check_tree(coord.client, root.chain_id)


def test_the_dashboard_tree_shows_calls_run_and_refused(redis_url: str) -> None:
    pytest.importorskip("starlette")
    from tests.support.dashboard_server import VIEWER_TOKEN, coordinator, dashboard, open_tree

    coord = coordinator(redis_url)
    root = open_tree(coord, "books-dash")
    child = root.spawn_child(max_cost_usd=0.01)
    assert child.wrap_llm_call(lambda: 1 / 0) == Decision.RETRY
    for _ in range(2):
        assert child.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.05)) \
            == Decision.HALT
    coord.store.flush()
    with dashboard(redis_url) as http:
        kid = http.json(f"/api/trees/{child.chain_id}")["contexts"][child.chain_id]
        assert kid["calls_run"] == 1
        assert kid["refused_text"] == "2 refused: budget_exceeded"
        status, _, page = http.request("GET", f"/trees/{child.chain_id}", token=VIEWER_TOKEN)
        assert status == 200
        assert '<span class="refused">2 refused: budget_exceeded</span>' in page
    root.close()
    coord.close()


def test_a_corrupt_count_never_stops_a_charge(coord: Coordinator) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=50,
                                           max_retries_total=5), coordinator=coord)
    assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01)) == Decision.ALLOW
    coord.client.hset(KeySpace().ctx(ctx.root_id, ctx.chain_id), "n:ok", "abc")
    for _ in range(2):
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                 WrapOptions(cost_estimate_hint=0.005)) == Decision.ALLOW
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.03) and snap.step_count == 3
    assert snap.calls == {}  # the unreadable count reads as 0, the charges all landed
    ctx.close()
    check_tree(coord.client, ctx.chain_id)
