"""Wait for approval (ExecutionConfig.approval_wait_s, issue 32): a call that meets a
ceiling waits for an operator's raise instead of halting at once, the root's hash showing
the tree waiting meanwhile (store/approval.py's three fields); a raise from another
process lets it go on, reserved then; without one it halts at its timeout as it would
have at once; an abort ends the wait at once; an async wait leaves the event loop free."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
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
    WrapOptions,
    report_usage,
)
from coordinator.errors import InvalidConfigError
from coordinator.store.approval import APPROVAL_FIELDS, end_wait, start_wait, waiting_for_approval
from tests.support.invariants import check_tree
from tests.support.waiting import until

CENT = WrapOptions(cost_estimate_hint=0.01)


def _root(usd: float = 0.05, wait_s: float | None = 30.0) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=100,
                                            max_retries_total=5, approval_wait_s=wait_s))


def _spend(ctx: ExecutionContext, usd: float) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


class _Waiting:
    """A call made in a thread of its own: its decision and when it came."""

    def __init__(self, ctx: ExecutionContext, usd: float) -> None:
        self.decision: Decision | None = None
        self.at = 0.0
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(ctx, usd), daemon=True)
        self.thread.start()

    def _run(self, ctx: ExecutionContext, usd: float) -> None:
        self.decision = _spend(ctx, usd)
        self.at = time.monotonic()

    def result(self) -> Decision | None:
        self.thread.join(60)
        return self.decision


def _cli(redis_url: str, *args: str) -> float:
    """Run budgetctl in another process; when it was done (time.monotonic())."""
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return time.monotonic()


def _shown(coord: Coordinator, ctx: ExecutionContext) -> dict[str, Any] | None:
    return waiting_for_approval(coord.store, ctx.root_id)


def _shown_waiting(coord: Coordinator, ctx: ExecutionContext) -> dict[str, Any]:
    shown = until(lambda: _shown(coord, ctx), "the tree shown waiting for approval")
    assert shown is not None
    return shown


def _books(coord: Coordinator, root: ExecutionContext) -> int:
    assert isinstance(coord.client, redis.Redis)
    return check_tree(coord.client, root.root_id, coord.keyspace)


def _last_node(ctx: ExecutionContext) -> tuple[str, str | None]:
    node = ctx.get_snapshot().nodes[-1]
    return node.status, node.stop_reason


def test_the_root_hash_shows_a_wait_until_it_ends(coord: Coordinator) -> None:
    root = _root()
    child = root.spawn_child()
    store, rid = coord.store, root.root_id
    assert waiting_for_approval(store, rid) is None
    until_ms = start_wait(store, rid, child.chain_id, "budget_exceeded", 5000)
    shown = waiting_for_approval(store, rid)
    assert shown == {"approval_ctx": child.chain_id, "approval_reason": "budget_exceeded",
                     "approval_until_ms": until_ms}
    assert 4000 < until_ms - int(time.time() * 1000) < 6000
    # a later wait replaces it; the earlier one's end leaves the later one shown
    later = start_wait(store, rid, root.chain_id, "step_limit_exceeded", 5000)
    assert not end_wait(store, rid, child.chain_id, until_ms)
    assert waiting_for_approval(store, rid) is not None
    assert end_wait(store, rid, root.chain_id, later)
    assert waiting_for_approval(store, rid) is None
    assert not set(APPROVAL_FIELDS) & set(store.read_hash(rid, rid))
    # a wait whose end passed is not shown even if its fields stayed (its process died)
    start_wait(store, rid, rid, "budget_exceeded", 1)
    time.sleep(0.01)
    assert waiting_for_approval(store, rid) is None
    assert start_wait(store, "gone", "gone", "budget_exceeded", 1000) == 0
    child.close()
    root.close()


def test_a_waiting_call_goes_on_when_another_process_raises_the_limit(
        coord: Coordinator, redis_url: str) -> None:
    root = _root(usd=0.05)
    assert [_spend(root, 0.01) for _ in range(5)] == [Decision.ALLOW] * 5
    call = _Waiting(root, 0.01)
    shown = _shown_waiting(coord, root)
    assert shown["approval_ctx"] == root.chain_id
    assert shown["approval_reason"] == "budget_exceeded"
    assert call.decision is None
    coord.store.flush()
    raised = _cli(redis_url, "limit", root.chain_id, "--usd", "0.10", "--reason", "approved")
    assert call.result() == Decision.ALLOW
    assert call.at - raised < 1.0, "it went on within about a second of the raise"
    until(lambda: _shown(coord, root) is None, "the wait no longer shown")
    assert not set(APPROVAL_FIELDS) & set(coord.store.read_hash(root.root_id, root.root_id))
    snap = root.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.06)
    assert snap.abort_reason is None and snap.step_count == 6
    root.close()
    assert _books(coord, root) == 60_000


def test_without_a_raise_it_halts_at_its_timeout_as_it_would_have_at_once(
        coord: Coordinator) -> None:
    root = _root(usd=0.02, wait_s=0.5)
    child = root.spawn_child()
    assert child.config.approval_wait_s == 0.5  # inherited
    assert [_spend(child, 0.01) for _ in range(2)] == [Decision.ALLOW] * 2
    start = time.monotonic()
    call = _Waiting(child, 0.01)
    shown = _shown_waiting(coord, root)
    assert shown["approval_ctx"] == child.chain_id
    assert call.result() == Decision.HALT
    assert 0.5 <= call.at - start < 2.5
    assert _last_node(child) == ("halted", "budget_exceeded")
    until(lambda: _shown(coord, root) is None, "the wait no longer shown")
    events = [e.event_type for e in child.get_snapshot().events]
    assert events.count("budget_exceeded") == 1  # the same events as a halt at once
    child.close()
    root.close()
    assert _books(coord, root) == 20_000


def test_a_call_that_does_not_fit_waits_and_a_raise_that_lifts_no_stop_lets_it_go_on(
        coord: Coordinator) -> None:
    root = _root(usd=0.05)
    assert _spend(root, 0.03) == Decision.ALLOW
    call = _Waiting(root, 0.03)  # 0.06 > 0.05: no room, the level not stopped
    _shown_waiting(coord, root)
    assert root.stop_reason is None
    change = coord.set_limits(root.chain_id, max_cost_usd=0.10, actor="ops", reason="ok")
    assert change.lifted == ()  # nothing to lift: the call sees the room by asking again
    assert call.result() == Decision.ALLOW
    assert call.at - call.started < 30
    root.close()
    assert _books(coord, root) == 60_000


def test_a_raise_that_is_not_enough_keeps_it_waiting_until_its_timeout(
        coord: Coordinator) -> None:
    root = _root(usd=0.05, wait_s=3)
    assert _spend(root, 0.05) == Decision.ALLOW
    call = _Waiting(root, 0.03)
    _shown_waiting(coord, root)
    change = coord.set_limits(root.chain_id, max_cost_usd=0.06, actor="ops", reason="a bit")
    assert change.lifted == ("budget_exceeded",)
    time.sleep(0.7)  # heard, asked again: 0.05 + 0.03 still passes 0.06
    assert call.decision is None and _shown(coord, root) is not None
    assert call.result() == Decision.HALT
    assert call.at - call.started >= 3
    assert _last_node(root) == ("halted", "budget_exceeded")
    root.close()
    assert _books(coord, root) == 50_000


def test_an_abort_from_another_process_ends_the_wait_at_once(coord: Coordinator,
                                                             redis_url: str) -> None:
    root = _root(usd=0.01, wait_s=60)
    assert _spend(root, 0.01) == Decision.ALLOW
    call = _Waiting(root, 0.01)
    _shown_waiting(coord, root)
    aborted = _cli(redis_url, "abort", root.chain_id, "enough")
    assert call.result() == Decision.HALT
    assert call.at - aborted < 1.0
    assert _last_node(root) == ("aborted", "aborted")
    assert root.get_snapshot().abort_reason == "aborted"
    until(lambda: _shown(coord, root) is None, "the wait no longer shown")
    root.close()
    _books(coord, root)


def test_the_context_timing_out_ends_the_wait_with_timeout(coord: Coordinator) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.01, max_steps=100,
                                            max_retries_total=5, timeout_ms=1500,
                                            approval_wait_s=60))
    assert _spend(root, 0.01) == Decision.ALLOW
    call = _Waiting(root, 0.01)
    assert call.result() == Decision.HALT
    assert call.at - call.started < 5
    assert _last_node(root) == ("timeout", "timeout")
    until(lambda: _shown(coord, root) is None, "the wait no longer shown")
    root.close()
    _books(coord, root)


def test_a_call_in_lease_mode_waits_and_goes_on_after_a_raise(coord: Coordinator) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.03, max_steps=100,
                                            max_retries_total=5, lease=LeasePolicy(usd=0.02),
                                            approval_wait_s=30))
    assert [_spend(root, 0.01) for _ in range(3)] == [Decision.ALLOW] * 3
    call = _Waiting(root, 0.01)
    _shown_waiting(coord, root)
    coord.set_limits(root.chain_id, max_cost_usd=0.04, actor="ops", reason="ok")
    assert call.result() == Decision.ALLOW
    root.close()
    assert _books(coord, root) == 40_000


def test_an_async_waiting_call_leaves_the_event_loop_free(coord: Coordinator) -> None:
    root = _root(usd=0.01, wait_s=1.0)
    assert _spend(root, 0.01) == Decision.ALLOW

    async def cost() -> None:
        report_usage(cost_usd=0.01)

    async def main() -> tuple[Decision, int, float]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        start = time.monotonic()
        decision = await root.awrap_llm_call(cost, CENT)
        took = time.monotonic() - start
        done.set()
        await ticking
        return decision, ticks, took

    decision, ticks, took = asyncio.run(main())
    assert decision == Decision.HALT and took >= 1.0
    assert ticks >= 40, f"the loop ran {ticks} ticks of 10 ms in {took:.2f} s"
    assert _last_node(root) == ("halted", "budget_exceeded")
    root.close()
    _books(coord, root)


def test_an_async_waiting_call_goes_on_after_a_raise(coord: Coordinator) -> None:
    root = _root(usd=0.01, wait_s=30)
    assert _spend(root, 0.01) == Decision.ALLOW

    async def cost() -> None:
        report_usage(cost_usd=0.01)

    async def main() -> Decision:
        waiting = asyncio.create_task(root.awrap_llm_call(cost, CENT))
        while await asyncio.to_thread(_shown, coord, root) is None:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(coord.set_limits, root.chain_id, max_cost_usd=0.02,
                                actor="ops", reason="ok")
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(main()) == Decision.ALLOW
    root.close()
    assert _books(coord, root) == 20_000


def test_an_abort_ends_an_async_wait_at_once(coord: Coordinator) -> None:
    root = _root(usd=0.01, wait_s=60)
    assert _spend(root, 0.01) == Decision.ALLOW

    async def cost() -> None:
        report_usage(cost_usd=0.01)

    async def main() -> tuple[Decision, float]:
        waiting = asyncio.create_task(root.awrap_llm_call(cost, CENT))
        while await asyncio.to_thread(_shown, coord, root) is None:
            await asyncio.sleep(0.02)
        aborted = time.monotonic()
        await asyncio.to_thread(root.abort, "enough")
        decision = await asyncio.wait_for(waiting, 5)
        return decision, time.monotonic() - aborted

    decision, took = asyncio.run(main())
    assert decision == Decision.HALT and took < 1.0
    assert _last_node(root) == ("aborted", "aborted")
    root.close()
    _books(coord, root)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, 0, 1e400, 1e12, "5", True, [1]])
def test_bad_waits_are_refused_with_a_typed_error(bad: Any) -> None:
    with pytest.raises(InvalidConfigError, match="approval_wait_s"):
        ExecutionConfig(max_cost_usd=1, max_steps=1, max_retries_total=1,
                        approval_wait_s=bad)


def test_an_attached_handle_and_a_child_inherit_the_wait(coord: Coordinator) -> None:
    root = _root(wait_s=2.5)
    child = root.spawn_child(max_cost_usd=0.01)
    attached = ExecutionContext.attach(child.token, coordinator=coord)
    assert child.config.approval_wait_s == attached.config.approval_wait_s == 2.5
    assert _root(wait_s=None).config.approval_wait_s is None
    attached.close()
    child.close()
    root.close()
