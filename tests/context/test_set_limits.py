"""An operator changes a running context's limits (Coordinator.set_limits): a raise lifts
the ceiling stop in every process, a lowering below the spend stops the level, an
ancestor's ceiling still binds, and bad input changes nothing; each change is one
limits_changed event."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import queue
import time
from typing import Any

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    SafetyEvent,
    TokenBudget,
    WrapOptions,
    report_usage,
)
from coordinator.context.lease_registry import slice_of
from coordinator.core.paths import Path
from coordinator.core.vocabulary import CEILING_REASONS
from coordinator.errors import (
    ContextClosedError,
    ContextNotFoundError,
    CorruptStateError,
    InvalidConfigError,
)
from coordinator.models_limits import LimitChange
from coordinator.runtime.stop_listener import StopListener
from tests.support import limits_procs
from tests.support.invariants import check_tree
from tests.support.waiting import until

SPAWN = mp.get_context("spawn")
CENT = WrapOptions(cost_estimate_hint=0.01)


def _root(usd: float = 0.05, steps: int = 100, retries: int = 5) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=steps,
                                            max_retries_total=retries))


def _spend(ctx: ExecutionContext, calls: int) -> list[Decision]:
    return [ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01), CENT) for _ in range(calls)]


def _changes(ctx: ExecutionContext) -> list[SafetyEvent]:
    return [e for e in ctx.get_snapshot().events if e.event_type == "limits_changed"]


def _hash(coord: Coordinator, ctx: ExecutionContext) -> dict[str, str]:
    return coord.store.read_hash(ctx.root_id, ctx.chain_id)


def _books(coord: Coordinator, root: ExecutionContext) -> int:
    """The tree's books checked (tests/support/invariants.py): its root's micro-USD."""
    assert isinstance(coord.client, redis.Redis)
    return check_tree(coord.client, root.root_id, coord.keyspace)


def _decisions(out: Any) -> list[tuple[str, float]]:
    got = []
    while True:
        try:
            got.append(out.get_nowait())
        except queue.Empty:
            return got


def test_a_raise_reaches_the_process_that_hit_the_ceiling(coord: Coordinator,
                                                          redis_url: str) -> None:
    root = _root(usd=0.05)
    stop, out = SPAWN.Event(), SPAWN.Queue()
    proc = SPAWN.Process(target=limits_procs.spend_steadily,
                         args=(redis_url, root.token, 0.01, stop, out))
    proc.start()
    seen: list[tuple[str, float]] = []

    def halted_after(allowed: int) -> bool:
        seen.extend(_decisions(out))
        return sum(d == "ALLOW" for d, _ in seen) == allowed and seen[-1][0] == "HALT"

    try:
        until(lambda: halted_after(5), "the other process spent the root to its ceiling")
        assert root.get_snapshot().abort_reason == "budget_exceeded"
        raised_at = time.time()
        change = coord.set_limits(root.chain_id, max_cost_usd=0.10, actor="ops@example",
                                  reason="approved")
        assert change.lifted == ("budget_exceeded",) and not change.stopped
        assert change.changes == (LimitChange(limit="max_cost_usd", before=0.05, after=0.10),)
        until(lambda: halted_after(10), "the other process spent up to the new ceiling")
        first_allowed = next(t for d, t in seen[5:] if d == "ALLOW")
        assert first_allowed - raised_at < 1.5, "the raise was heard within about a second"
    finally:
        stop.set()
        proc.join(30)
    snap = root.get_snapshot()
    assert (snap.cost_usd_accumulated, snap.abort_reason) == (0.10, "budget_exceeded")
    [event] = _changes(root)
    assert event.metadata["actor"] == "ops@example"
    assert event.metadata["reason"] == "approved"
    assert event.metadata["limits"] == {"usd": {"before": 50_000, "after": 100_000}}
    assert event.metadata["lifted"] == "budget_exceeded"
    assert "usd $0.05 -> $0.10" in event.reason
    stops = [e.event_type for e in snap.events if e.event_type == "budget_exceeded"]
    assert len(stops) == 2  # the first ceiling, then the raised one
    root.close()
    assert _books(coord, root) == 100_000


def test_a_raise_on_a_handle_lifts_the_stop_it_heard(coord: Coordinator) -> None:
    root = _root(usd=0.02)
    child = root.spawn_child()
    assert _spend(root, 3) == [Decision.ALLOW, Decision.ALLOW, Decision.HALT]
    until(lambda: child.stop_reason == "budget_exceeded", "the child heard the root's stop")
    assert child.wrap_llm_call(lambda: None, CENT) == Decision.HALT
    change = root.set_limits(max_cost_usd=0.03, max_steps=50, actor="me", reason="one more")
    assert change.lifted == ("budget_exceeded",)
    assert child.stop_reason is None and root.stop_reason is None  # heard here at once
    assert _spend(child, 2) == [Decision.ALLOW, Decision.HALT]
    assert [(c.limit, c.before, c.after) for c in change.changes] == [
        ("max_cost_usd", 0.02, 0.03), ("max_steps", 100, 50)]
    child.close()
    root.close()
    _books(coord, root)


def test_a_raise_lets_a_process_in_lease_mode_take_slices_again(coord: Coordinator) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=100,
                                            max_retries_total=3,
                                            lease=LeasePolicy(usd=0.02, steps=10)))
    decisions = _spend(root, 7)
    assert decisions.count(Decision.ALLOW) == 5 and decisions[-1] == Decision.HALT
    lease = slice_of(root._state)
    assert lease is not None
    until(lambda: lease.stopped == root.stop_reason == "budget_exceeded", "the stop was heard")
    assert root.set_limits(max_cost_usd=0.08, actor="ops").lifted == ("budget_exceeded",)
    assert lease.stopped is None  # it takes slices again
    decisions = _spend(root, 5)
    assert decisions.count(Decision.ALLOW) == 3 and decisions[-1] == Decision.HALT
    root.close()
    assert _books(coord, root) == 80_000


def test_raising_never_lifts_an_abort(coord: Coordinator) -> None:
    root = _root(usd=0.02)
    _spend(root, 2)
    root.abort("enough")
    change = coord.set_limits(root.chain_id, max_cost_usd=1.0, actor="ops")
    assert change.lifted == () and change.stopped and change.stop_reason == "aborted"
    assert root.wrap_llm_call(lambda: None) == Decision.HALT
    snap = root.get_snapshot()
    assert (snap.abort_reason, snap.max_cost_usd) == ("aborted", 1.0)
    assert len(_changes(root)) == 1
    root.close()


def test_an_abort_of_a_running_context_outlasts_a_raise(coord: Coordinator) -> None:
    root = _root(usd=0.05)
    child = root.spawn_child()
    root.abort("stop the run")
    change = coord.set_limits(root.chain_id, max_cost_usd=1.0, max_steps=500, actor="ops")
    assert (change.lifted, change.stop_reason) == ((), "aborted")
    assert child.wrap_llm_call(lambda: None, CENT) == Decision.HALT
    assert child.stop_reason == "aborted"
    child.close()
    root.close()


def test_retry_and_token_stops_are_lifted_by_their_own_limits(coord: Coordinator) -> None:
    root = ExecutionContext(ExecutionConfig(
        max_cost_usd=1.0, max_steps=100, max_retries_total=1,
        token_budget=TokenBudget(total=100)))

    def fail() -> None:
        raise RuntimeError("provider 500")

    root.wrap_llm_call(fail, CENT)
    assert root.get_snapshot().abort_reason == "retry_budget_exceeded"
    assert coord.set_limits(root.chain_id, max_cost_usd=2.0, actor="ops").lifted == ()
    assert coord.set_limits(root.chain_id, max_retries_total=2,
                            actor="ops").lifted == ("retry_budget_exceeded",)
    tokens = WrapOptions(cost_estimate_hint=0.01, input_tokens_estimate=60,
                         max_output_tokens=40)
    used = root.wrap_llm_call(lambda: report_usage(input_tokens=60, output_tokens=40), tokens)
    assert used == Decision.ALLOW
    assert root.get_snapshot().abort_reason == "token_budget_exceeded"
    change = coord.set_limits(root.chain_id, token_budget=TokenBudget(total=200), actor="ops")
    assert change.lifted == ("token_budget_exceeded",)
    assert root.wrap_llm_call(lambda: None, tokens) == Decision.ALLOW
    root.close()
    _books(coord, root)


def test_a_call_in_flight_finishes_when_the_limit_is_lowered(coord: Coordinator) -> None:
    root = _root(usd=1.0)
    _spend(root, 2)

    def body() -> None:
        assert coord.set_limits(root.chain_id, max_cost_usd=0.02, actor="ops").stopped
        report_usage(cost_usd=0.01)

    assert root.wrap_llm_call(body, CENT) == Decision.ALLOW
    assert root.wrap_llm_call(lambda: None, CENT) == Decision.HALT
    assert root.get_snapshot().cost_usd_accumulated == 0.03  # charged, never rewritten
    root.close()


def test_a_stop_heard_just_after_a_lift_is_checked_in_redis(coord: Coordinator) -> None:
    root = _root(usd=0.01)
    _spend(root, 2)
    coord.set_limits(root.chain_id, max_cost_usd=0.05, actor="ops")
    # a reserve's reply sent before the lift, read after it, tells of the lifted stop
    root._state.handle_stop("budget_exceeded")
    until(lambda: root.stop_reason is None, "the stale stop was checked and forgotten")
    assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.01), CENT) == Decision.ALLOW
    root.close()


def test_the_listener_applies_a_lift_to_the_handles_under_it() -> None:
    class Handle:
        def __init__(self, *ids: str) -> None:
            self.tree_path = Path("r", ids)
            self.heard: list[Any] = []

        def handle_stop(self, reason: str) -> None:
            self.heard.append(reason)

        def handle_lift(self, reasons: frozenset[str]) -> None:
            self.heard.append(reasons)

    listener = StopListener(lambda: None, lambda paths: [])  # type: ignore[arg-type,return-value]
    under, beside = Handle("r", "a", "b"), Handle("r", "c")
    for handle in (under, beside):
        listener.add(handle)
    listener.on_message(json.dumps({"root": "r", "id": "a", "lifted": ["budget_exceeded"]}))
    listener.on_message(json.dumps({"root": "r", "id": "a", "lifted": {}}))  # Lua's {}
    listener.on_message(json.dumps({"root": "r", "id": "r", "reason": "aborted"}))
    assert under.heard == [frozenset({"budget_exceeded"}), "aborted"]
    assert beside.heard == ["aborted"]
    # resubscribed after missing messages: the stops Redis has, and the lifts of the rest
    stops = {under.tree_path: ["budget_exceeded"], beside.tree_path: []}
    listener = StopListener(lambda: None,  # type: ignore[arg-type,return-value]
                            lambda paths: [stops[p] for p in paths])
    for handle in (under, beside):
        handle.heard.clear()
        listener.add(handle)
    listener._resync()
    assert under.heard == ["budget_exceeded", CEILING_REASONS - {"budget_exceeded"}]
    assert beside.heard == [CEILING_REASONS]


def test_a_raise_below_the_spend_lifts_nothing(coord: Coordinator) -> None:
    root = _root(usd=0.02, steps=2)
    _spend(root, 3)
    assert root.get_snapshot().abort_reason == "budget_exceeded"
    change = coord.set_limits(root.chain_id, max_steps=10, actor="ops")
    assert (change.lifted, change.stop_reason) == ((), "budget_exceeded")
    root.close()


def test_lowering_below_the_spend_stops_the_level(coord: Coordinator) -> None:
    root = _root(usd=1.0)
    child = root.spawn_child()
    _spend(child, 3)
    change = coord.set_limits(root.chain_id, max_cost_usd=0.02, actor="ops", reason="cut")
    assert change.stopped and change.stop_reason == "budget_exceeded" and change.lifted == ()
    assert child.wrap_llm_call(lambda: None, CENT) == Decision.HALT
    snap = root.get_snapshot()
    assert (snap.cost_usd_accumulated, snap.max_cost_usd) == (0.03, 0.02)  # spend kept
    kinds = [e.event_type for e in snap.events]
    assert kinds[-2:] == ["limits_changed", "budget_exceeded"]
    assert snap.events[-1].reason == "dimension usd at $0.03 reached its limit $0.02"
    assert _changes(root)[0].metadata["stopped"] == "budget_exceeded"
    child.close()
    root.close()


def test_lowering_to_the_spend_stops_and_keeps_the_books(coord: Coordinator) -> None:
    root = _root(usd=1.0, steps=10)
    _spend(root, 3)
    change = coord.set_limits(root.chain_id, max_steps=3, actor="ops")
    assert change.stop_reason == "step_limit_exceeded"
    assert root.wrap_llm_call(lambda: None, CENT) == Decision.HALT
    again = coord.set_limits(root.chain_id, max_steps=4, actor="ops")
    assert again.lifted == ("step_limit_exceeded",)
    assert _spend(root, 2) == [Decision.ALLOW, Decision.HALT]
    root.close()
    assert _books(coord, root) == 40_000


def test_a_raised_child_cannot_pass_its_parents_ceiling(coord: Coordinator) -> None:
    root = _root(usd=0.05)
    child = root.spawn_child(max_cost_usd=0.02)
    assert _spend(child, 3)[-1] == Decision.HALT
    change = child.set_limits(max_cost_usd=1.0, actor="ops")
    assert change.lifted == ("budget_exceeded",)
    decisions = _spend(child, 5)
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT] * 2
    snap = child.get_snapshot()
    assert (snap.stopped_by, snap.abort_reason) == (root.chain_id, "budget_exceeded")
    child.close()
    root.close()
    assert _books(coord, root) == 50_000


def test_token_and_retry_limits(coord: Coordinator) -> None:
    root = ExecutionContext(ExecutionConfig(
        max_cost_usd=1.0, max_steps=100, max_retries_total=5,
        token_budget=TokenBudget(total=1000)))
    change = coord.set_limits(root.chain_id, max_retries_total=1,
                              token_budget=TokenBudget(total=2000, output=500), actor="ops")
    assert [(c.limit, c.before, c.after) for c in change.changes] == [
        ("max_retries_total", 5, 1), ("token_budget.total", 1000, 2000),
        ("token_budget.output", None, 500)]
    assert root.get_snapshot().token_limits == {"total": 2000, "output": 500}
    assert not change.stopped
    root.close()


BAD: list[dict[str, Any]] = [
    {"max_cost_usd": math.nan}, {"max_cost_usd": -1.0}, {"max_cost_usd": math.inf},
    {"max_cost_usd": float("1e400")}, {"max_cost_usd": "0.5"}, {"max_cost_usd": "0x10"},
    {"max_cost_usd": True}, {"max_cost_usd": 0}, {"max_cost_usd": 2e9},
    {"max_steps": 2.5}, {"max_steps": "3"}, {"max_steps": 0}, {"max_retries_total": -1},
    {"max_steps": 10**16}, {"token_budget": {"total": -5}}, {},
    {"max_steps": 5, "actor": ""}, {"max_steps": 5, "reason": 7},
    {"max_steps": 5, "reason": "x" * 1001},
]


@pytest.mark.parametrize("bad", BAD, ids=[repr(b)[:40] for b in BAD])
def test_bad_values_change_nothing(coord: Coordinator, bad: dict[str, Any]) -> None:
    root = _root()
    before = _hash(coord, root)
    with pytest.raises(InvalidConfigError):
        coord.set_limits(root.chain_id, **{"actor": "ops", **bad})
    assert _hash(coord, root) == before
    assert _changes(root) == []
    root.close()


def test_a_corrupt_counter_changes_nothing(coord: Coordinator) -> None:
    root = _root()
    coord.client.hset(coord.keyspace.ctx(root.root_id, root.chain_id), "u:steps", "1e3")
    before = _hash(coord, root)
    with pytest.raises(CorruptStateError):
        coord.set_limits(root.chain_id, max_cost_usd=1.0, actor="ops")
    assert _hash(coord, root) == before
    assert _changes(root) == []


def test_unknown_and_closed_contexts_change_nothing(coord: Coordinator) -> None:
    with pytest.raises(ContextNotFoundError):
        coord.set_limits("no-such-context", max_cost_usd=1.0)
    root = _root()
    child = root.spawn_child()
    root.close()  # the tree is closed: its child too
    for ctx in (root, child):
        before = _hash(coord, ctx)
        with pytest.raises(ContextClosedError) as err:
            coord.set_limits(ctx.chain_id, max_cost_usd=1.0)
        assert err.value.closed_by == root.chain_id
        assert _hash(coord, ctx) == before
    assert not any(e.event_type == "limits_changed"
                   for ctx in (root, child) for e in ctx.get_snapshot().events)
