"""``budgetctl tree`` lists what operators did to the tree under it: a limits_changed with
who, why and each limit before -> after (the stop it lifted is on the context's line)."""

from __future__ import annotations

import json
import uuid

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from tests.support.cli import budgetctl

Capture = pytest.CaptureFixture[str]


def test_tree_shows_a_limits_change_and_the_stop(coord: Coordinator, redis_url: str,
                                                 capsys: Capture) -> None:
    config = ExecutionConfig(max_cost_usd=0.05, max_steps=20, max_retries_total=3)
    run = ExecutionContext(config,
                           metadata=ChainMetadata(request_id=uuid.uuid4().hex,
                                                  chain_id="events-tree"))
    spend = WrapOptions(cost_estimate_hint=0.05)
    assert run.wrap_llm_call(lambda: report_usage(cost_usd=0.05), spend) == Decision.ALLOW
    assert run.wrap_llm_call(lambda: report_usage(cost_usd=0.01), spend) == Decision.HALT
    coord.store.flush()
    coord.set_limits("events-tree", max_cost_usd=0.10, max_steps=30, actor="olga",
                     reason="approved by finance")

    code, out, _ = budgetctl(capsys, redis_url, "tree", "events-tree")
    assert code == 0
    head, _, events = out.partition("events, newest first:")
    assert "events-tree" in head and events, out
    lines = [ln for ln in events.splitlines() if ln.strip()]
    assert "limits_changed" in lines[0]
    assert lines[0].endswith("by olga: max_cost_usd $0.05 -> $0.10, max_steps 20 -> 30 "
                             "(approved by finance); lifted budget_exceeded"), lines[0]
    assert len(lines) == 1, lines  # the stop is on the context's line, not listed

    code, out, _ = budgetctl(capsys, redis_url, "tree", "events-tree", "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"read_at_ms", "tree", "recent_calls", "events"}
    change = doc["events"][0]
    assert (change["event_type"], change["actor"], change["context"]) == (
        "limits_changed", "olga", "events-tree")
    assert change["changes"] == [
        {"limit": "max_cost_usd", "before": 0.05, "after": 0.1},
        {"limit": "max_steps", "before": 20, "after": 30}]
    assert len(doc["events"]) == 1
    run.close()
