"""The Limits specification across the tree: token budgets with provider shares,
deadlines, the token ledger, evaluate() and current_limits()."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from datetime import datetime, timedelta, timezone

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
    current_limits,
    report_usage,
)
from coordinator.errors import (
    DeadlineExceededError,
    InvalidConfigError,
    PromptEvaluationError,
    TokenBudgetExceededError,
)
from tests.support import procs
from tests.support.invariants import check_tree

SPAWN = mp.get_context("spawn")


def config(**kw: object) -> ExecutionConfig:
    base: dict[str, object] = {"max_cost_usd": 10.0, "max_steps": 1000, "max_retries_total": 10}
    base.update(kw)
    return ExecutionConfig(**base)  # type: ignore[arg-type]


def in_(seconds: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def openai_call(tin: int, tout: int) -> WrapOptions:
    return WrapOptions(provider="openai", input_tokens_estimate=tin, max_output_tokens=tout)


# -- validation (preflight) ---------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: config(deadline=datetime.now() + timedelta(hours=1)),       # no tzinfo
    lambda: config(deadline=in_(-5)),                                   # in the past
    lambda: config(deadline=in_(0.5)),                                  # within this second
    lambda: TokenBudget(total=0),
    lambda: TokenBudget(input=-3),
    lambda: TokenBudget(output=1.5),
    lambda: TokenBudget(total=100, input=200),                          # total < input
    lambda: TokenBudget(total=100, output=101),                         # total < output
    lambda: TokenBudget(provider_shares={"openai": TokenBudget(total=-1)}),
    lambda: TokenBudget(provider_shares={"bad slug!": TokenBudget(total=1)}),
    lambda: TokenBudget(provider_shares={"a": TokenBudget(
        provider_shares={"b": TokenBudget(total=1)})}),                # shares do not nest
])
def test_invalid_limits_fail_preflight(make: object) -> None:
    with pytest.raises(PromptEvaluationError) as err:
        make()  # type: ignore[operator]
    assert err.value.phase == "preflight"
    assert isinstance(err.value, InvalidConfigError)


def test_evaluate_rejects_a_bad_deadline_before_calling(coord: Coordinator) -> None:
    with ExecutionContext(config()) as ctx:
        ran = []
        with pytest.raises(PromptEvaluationError) as err:
            ctx.evaluate(lambda: ran.append(1), deadline=datetime.now() + timedelta(hours=1))
        assert err.value.phase == "preflight" and ran == []


# -- enforcement ----------------------------------------------------------------------------

def test_tool_handler_sees_the_deadline_and_allowances(coord: Coordinator) -> None:
    deadline = in_(5)
    budget = TokenBudget(total=5000, provider_shares={"openai": TokenBudget(output=800)})
    seen = []
    with ExecutionContext(config(deadline=deadline, token_budget=budget)) as ctx:
        ctx.evaluate(lambda: seen.append(current_limits()), openai_call(100, 300))
    limits = seen[0]
    assert limits is not None and limits.deadline is not None
    assert abs(limits.deadline.timestamp() - deadline.timestamp()) < 0.01
    assert 2000 < limits.time_remaining_ms <= 5000
    # the call's own reservation is in flight while it runs
    assert limits.tokens_remaining == {"total": 4600, "openai.output": 500}
    assert current_limits() is None


def test_repeated_calls_exhaust_the_budget_with_phase_token_budget(coord: Coordinator) -> None:
    calls = []

    def llm() -> str:
        calls.append(1)
        report_usage(input_tokens=250, output_tokens=100, provider="openai")
        return "ok"

    with ExecutionContext(config(token_budget=TokenBudget(total=1000))) as ctx:
        results = [ctx.evaluate(llm, openai_call(250, 100)) for _ in range(2)]
        assert results == ["ok", "ok"]
        with pytest.raises(PromptEvaluationError) as err:
            ctx.evaluate(llm, openai_call(250, 100))   # 700 + 350 > 1000: refused
        assert len(calls) == 2
        assert err.value.phase == "token_budget"
        payload = err.value.provider_payload
        assert payload["tokens_remaining"] == {"total": 300}
        assert "deadline" in payload
        snap = ctx.get_snapshot()
        assert (snap.tokens.input, snap.tokens.output, snap.tokens.total) == (500, 200, 700)
        assert snap.tokens.by_provider["openai"].total == 700
        assert snap.events[-1].event_type == "token_budget_exceeded"
        assert not snap.aborted  # the budget is not used up: a smaller call still fits
        assert ctx.wrap_llm_call(lambda: None, openai_call(200, 100)) == Decision.ALLOW


def test_worst_case_output_is_reserved(coord: Coordinator) -> None:
    with ExecutionContext(config(token_budget=TokenBudget(output=1000))) as ctx:
        # max_tokens is reserved even if the reply turns out short
        assert ctx.wrap_llm_call(lambda: None, openai_call(10, 1200)) == Decision.HALT
        assert ctx.wrap_llm_call(
            lambda: report_usage(input_tokens=10, output_tokens=30), openai_call(10, 1000)
        ) == Decision.ALLOW
        assert ctx.get_snapshot().tokens.output == 30


def test_provider_share_limits_only_that_provider(coord: Coordinator) -> None:
    budget = TokenBudget(total=10_000, provider_shares={"openai": TokenBudget(total=300)})
    with ExecutionContext(config(token_budget=budget)) as ctx:
        assert ctx.wrap_llm_call(lambda: None, openai_call(200, 200)) == Decision.HALT
        anthropic = WrapOptions(provider="anthropic", input_tokens_estimate=200,
                                max_output_tokens=200)
        assert ctx.wrap_llm_call(lambda: None, anthropic) == Decision.ALLOW
        snap = ctx.get_snapshot()
        assert snap.token_limits == {"total": 10_000, "openai.total": 300}
        assert snap.tokens.by_provider["anthropic"].total == 400


def test_a_total_counts_what_calls_in_flight_hold_in_both_directions(
        coord: Coordinator) -> None:
    # A total is the sum of its two directions: held input and held output of a call in
    # flight both count against it, overall and per provider.
    budget = TokenBudget(total=1000, provider_shares={"openai": TokenBudget(total=600)})
    with ExecutionContext(config(token_budget=budget)) as ctx:
        inner: list[Decision] = []

        def outer_call() -> None:  # holds 300 in + 200 out (openai) while it runs
            snap = ctx.get_snapshot()
            assert snap.tokens.reserved == 500
            assert snap.tokens.by_provider["openai"].reserved == 500
            inner.append(ctx.wrap_llm_call(lambda: None, openai_call(50, 100)))  # 650 > 600
            anthropic = WrapOptions(provider="anthropic", input_tokens_estimate=300,
                                    max_output_tokens=200)
            inner.append(ctx.wrap_llm_call(lambda: None, anthropic))  # 1000: fits exactly
            inner.append(ctx.wrap_llm_call(                           # 1001 > 1000
                lambda: None, WrapOptions(input_tokens_estimate=1, max_output_tokens=0)))
            report_usage(input_tokens=100, output_tokens=50, provider="openai")

        assert ctx.wrap_llm_call(outer_call, openai_call(300, 200)) == Decision.ALLOW
        assert inner == [Decision.HALT, Decision.ALLOW, Decision.HALT]
        snap = ctx.get_snapshot()
        assert (snap.tokens.total, snap.tokens.reserved) == (650, 0)
        assert snap.tokens.by_provider["openai"].total == 150
        assert snap.tokens.by_provider["anthropic"].total == 500
        assert "openai.ttot" in snap.events[0].reason
    check_tree(coord.client, ctx.chain_id)


def test_share_larger_than_its_budget_is_clamped_and_reported(coord: Coordinator) -> None:
    budget = TokenBudget(total=1000, provider_shares={"openai": TokenBudget(total=5000)})
    with ExecutionContext(config(token_budget=budget)) as ctx:
        snap = ctx.get_snapshot()
        assert snap.token_limits["openai.total"] == 1000
        assert "openai.total" in snap.clamped


def test_parent_and_child_conflicting_limits_tightest_wins(coord: Coordinator) -> None:
    parent_deadline, child_deadline = in_(20), in_(120)
    with ExecutionContext(config(deadline=parent_deadline,
                                 token_budget=TokenBudget(total=1000, output=400))) as parent:
        parent.wrap_llm_call(lambda: report_usage(input_tokens=100, output_tokens=100),
                             openai_call(100, 100))
        child = parent.spawn_child(deadline=child_deadline,
                                   token_budget=TokenBudget(total=5000, input=300))
        snap = child.get_snapshot()
        assert snap.deadline is not None
        assert abs(snap.deadline.timestamp() - parent_deadline.timestamp()) < 0.01
        # own 5000 vs 800 remaining above; output inherited (300 left); input its own 300
        assert snap.token_limits == {"total": 800, "output": 300, "input": 300}
        assert "total" in snap.clamped
        # a tighter child deadline stays the child's
        tighter = parent.spawn_child(deadline=in_(5))
        assert tighter.deadline is not None and tighter.deadline < parent_deadline
        # the parent's output limit binds the child although the child set none
        assert child.wrap_llm_call(lambda: None, openai_call(10, 350)) == Decision.HALT
        child.close()
        tighter.close()


def test_evaluate_tightens_limits_for_the_call_and_its_spawns(coord: Coordinator) -> None:
    inner = []

    def agent() -> None:
        here = current_limits()
        assert here is not None
        inner.append(here.tokens_remaining)
        from coordinator import current_context

        sub = current_context()
        assert sub is not None
        spawned = sub.spawn_child()
        inner.append(spawned.get_snapshot().token_limits)
        spawned.close()

    with ExecutionContext(config()) as ctx:
        ctx.evaluate(agent, token_budget=TokenBudget(total=700))
        assert inner == [{"total": 700}, {"total": 700}]
        assert ctx.get_snapshot().token_limits == {}  # the context's own stay unchanged


def test_omitting_both_limits_changes_nothing(coord: Coordinator) -> None:
    with ExecutionContext(config()) as ctx:
        assert ctx.evaluate(lambda: 42) == 42
        assert ctx.wrap_llm_call(lambda: report_usage(input_tokens=10**6, output_tokens=10**6),
                                 openai_call(10**6, 10**6)) == Decision.ALLOW
        snap = ctx.get_snapshot()
        assert snap.token_limits == {} and snap.deadline is None and not snap.aborted
        assert snap.tokens.total == 2 * 10**6


def test_tool_limit_errors_become_prompt_evaluation_errors(coord: Coordinator) -> None:
    def slow_tool() -> None:
        raise DeadlineExceededError("cannot finish before the cutoff")

    def greedy_tool() -> None:
        raise TokenBudgetExceededError("needs 5000 tokens")

    with ExecutionContext(config(deadline=in_(30))) as ctx:
        with pytest.raises(PromptEvaluationError) as err:
            ctx.evaluate(slow_tool)
        assert err.value.phase == "deadline"
        assert isinstance(err.value.__cause__, DeadlineExceededError)
        assert err.value.provider_payload["deadline"] is not None
        with pytest.raises(PromptEvaluationError) as err:
            ctx.evaluate(greedy_tool)
        assert err.value.phase == "token_budget"
        assert ctx.wrap_tool_call(slow_tool) == Decision.HALT
        snap = ctx.get_snapshot()
        assert snap.retries_used == 0
        assert [e.event_type for e in snap.events][:3] == [
            "timeout", "token_budget_exceeded", "timeout"]


def test_expired_deadline_raises_without_calling(coord: Coordinator) -> None:
    ctx = ExecutionContext(config(timeout_ms=100))
    time.sleep(0.25)
    ran = []
    with pytest.raises(PromptEvaluationError) as err:
        ctx.evaluate(lambda: ran.append(1))
    assert err.value.phase == "deadline" and ran == []
    with pytest.raises(PromptEvaluationError) as err:
        ctx.evaluate(lambda: None, token_budget=TokenBudget(total=5))
    assert err.value.phase == "deadline"
    ctx.abort("done")
    ctx.close()
    other = ExecutionContext(config())
    other.abort("stop")
    with pytest.raises(PromptEvaluationError) as err:
        other.evaluate(lambda: None)
    assert err.value.phase == "halted" and err.value.reason == "aborted"
    other.close()


def test_token_ledger_reserve_consume_rollback_and_events(coord: Coordinator) -> None:
    pubsub = coord.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(coord.keyspace.ledger_channel)
    try:
        with ExecutionContext(config(token_budget=TokenBudget(total=1000))) as ctx:
            ledger = ctx.ledger
            r1 = ledger.reserve(input_tokens=400, output_tokens=300, provider="openai")
            assert r1.direction == "both"
            assert ledger.totals().reserved == 700
            with pytest.raises(PromptEvaluationError) as err:
                ledger.reserve(output_tokens=400)
            assert err.value.phase == "token_budget"
            ledger.consume(r1, input_tokens=380, output_tokens=120)
            ledger.consume(r1, input_tokens=380, output_tokens=120)  # idempotent
            r2 = ledger.reserve(output_tokens=400)
            assert r2.direction == "output"
            ledger.rollback(r2)
            totals = ledger.totals()
            assert (totals.input, totals.output, totals.reserved) == (380, 120, 0)
            assert totals.by_provider["openai"].total == 500
            stream = coord.client.xrange(coord.keyspace.ledger(ctx.root_id))
            events = [json.loads(fields["e"]) for _, fields in stream]
            consumed = [e for e in events if "delta" in e]
            assert len(consumed) == 1
            assert consumed[0]["delta"] == {"": {"input": 380, "output": 120, "total": 500},
                                            "openai": {"input": 380, "output": 120,
                                                       "total": 500}}
            assert consumed[0]["totals"]["openai"]["total"] == 500
            assert [e.get("change") for e in events if "change" in e] == [
                "reserved", "reserved", "rolled_back"]
        published = []
        deadline = time.monotonic() + 5
        while len(published) < 4 and time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=0.2)
            if msg:
                published.append(json.loads(msg["data"]))
        assert all(e["type"] == "TokenLedgerUpdated" for e in published)
        assert len(published) == 4
    finally:
        pubsub.close()


def test_closing_summary_reports_tokens_and_time_left(coord: Coordinator) -> None:
    with ExecutionContext(config(deadline=in_(60))) as ctx:
        ctx.wrap_llm_call(lambda: report_usage(input_tokens=12, output_tokens=8,
                                               provider="anthropic"))
    summary = ctx.get_snapshot().events[-1]
    assert summary.event_type == "context_summary"
    assert summary.metadata["tokens"]["by_provider"]["anthropic"]["output"] == 8
    assert 0 < summary.metadata["time_remaining_ms"] <= 60_000


@pytest.mark.slow
@pytest.mark.parametrize("k", [10, 20])
def test_k_agents_in_processes_share_one_token_budget(coord: Coordinator, redis_url: str,
                                                      k: int) -> None:
    with ExecutionContext(config(token_budget=TokenBudget(total=1000))) as root:
        out = SPAWN.Queue()
        agents = [SPAWN.Process(target=procs.token_agent, args=(redis_url, root.token, out))
                  for _ in range(k)]
        for a in agents:
            a.start()
        results = [out.get(timeout=180) for _ in agents]
        for a in agents:
            a.join(60)
        snap = root.get_snapshot()
        assert snap.tokens.total <= 1000
        assert snap.tokens.total == 1000  # exactly two 500-token calls fit
        assert sum(r["done"] for r in results) == 2
        assert snap.tokens.reserved == 0
    check_tree(coord.client, root.chain_id)


def test_async_twins_evaluate_and_wrap_tools(coord: Coordinator) -> None:
    import asyncio

    async def llm() -> str:
        report_usage(input_tokens=40, output_tokens=10, provider="openai")
        return "hello"

    async def tool() -> None:
        await asyncio.sleep(0)

    async def main() -> tuple[str, Decision]:
        async with ExecutionContext(config(token_budget=TokenBudget(total=100))) as ctx:
            text = await ctx.aevaluate(llm, openai_call(40, 20))
            decision = await ctx.awrap_tool_call(tool)
            with pytest.raises(PromptEvaluationError) as err:
                await ctx.aevaluate(llm, openai_call(40, 20))  # 50 + 60 > 100
            assert err.value.phase == "token_budget"
            assert ctx.get_snapshot().tokens.total == 50
            return text, decision

    assert asyncio.run(main()) == ("hello", Decision.ALLOW)
