"""ExecutionContext semantics in one process (the cross-process cases are in
test_distributed.py): limits, retries, timeouts, pipeline order, bad input."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    SafetyEvent,
    ShieldPipeline,
    ToolCallContext,
    WrapOptions,
    current_cancellation_token,
    current_context,
    report_usage,
)
from coordinator.context.wrap import run_sync
from coordinator.errors import (
    ContextExistsError,
    ContextNotFoundError,
    InvalidConfigError,
    InvalidCostError,
    PromptEvaluationError,
    TokenSignatureError,
)
from tests.support.invariants import check_tree


def config(**kw: object) -> ExecutionConfig:
    base: dict[str, object] = {"max_cost_usd": 1.0, "max_steps": 50, "max_retries_total": 3}
    base.update(kw)
    return ExecutionConfig(**base)  # type: ignore[arg-type]


def boom() -> None:
    raise RuntimeError("provider 503")


@pytest.mark.parametrize("bad", [
    {"max_cost_usd": float("nan")}, {"max_cost_usd": -1.0}, {"max_cost_usd": 0},
    {"max_cost_usd": math.inf}, {"max_steps": 0}, {"max_retries_total": -2},
    {"timeout_ms": -1}, {"max_steps": 1.5},
])
def test_invalid_limits_raise_typed_error(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError) as err:
        config(**bad)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value, PromptEvaluationError) and err.value.phase == "preflight"
    assert next(iter(bad)) in str(err.value)


def test_invalid_cost_report_is_charged_its_estimate_and_counts_a_retry(
        coord: Coordinator) -> None:
    with ExecutionContext(config()) as ctx:
        ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.1))
        for bad in (float("nan"), -0.5, math.inf):
            with pytest.raises(InvalidCostError):
                ctx.wrap_llm_call(lambda bad=bad: report_usage(cost_usd=bad),
                                  WrapOptions(cost_estimate_hint=0.02))
        with pytest.raises(InvalidConfigError):
            WrapOptions(cost_estimate_hint=float("nan"))
        after = ctx.get_snapshot()
        assert (after.step_count, after.retries_used) == (1, 3)
        assert after.cost_usd_accumulated == pytest.approx(0.1 + 3 * 0.02)
        assert after.cost_usd_reserved == 0
    check_tree(coord.client, ctx.chain_id)


def test_retry_budget_is_chain_wide_and_ends_with_provider_error(coord: Coordinator) -> None:
    with ExecutionContext(config(max_retries_total=3)) as root:
        child = root.spawn_child()
        assert child.wrap_llm_call(boom) == Decision.RETRY
        assert root.wrap_tool_call(boom) == Decision.RETRY
        # the third failure spends the budget shared by parent and child
        assert child.wrap_llm_call(boom) == Decision.HALT
        assert root.wrap_llm_call(lambda: None) == Decision.HALT
        snap = root.get_snapshot()
        assert snap.retries_used == 3
        assert snap.abort_reason == "retry_budget_exceeded"
        kinds = [e.event_type for e in child.get_snapshot().events]
        assert "provider_error" in kinds
        assert any(e.event_type == "retry_budget_exceeded" and e.hook == "ExecutionContext"
                   for e in snap.events)
        child.close()


def test_retry_policy_override_retries_the_call(coord: Coordinator) -> None:
    attempts = []

    def flaky() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("transient")
        report_usage(cost_usd=0.02)

    with ExecutionContext(config(max_retries_total=5)) as ctx:
        assert ctx.wrap_llm_call(flaky, WrapOptions(retry_policy_override=2)) == Decision.ALLOW
        snap = ctx.get_snapshot()
        assert len(attempts) == 3 and snap.retries_used == 2 and snap.step_count == 1


def test_spend_reported_before_a_failure_is_charged(coord: Coordinator) -> None:
    def spend_then_fail() -> None:
        report_usage(cost_usd=0.25, input_tokens=100, output_tokens=20, provider="openai")
        raise TimeoutError("read timed out after the provider billed")

    with ExecutionContext(config()) as ctx:
        assert ctx.wrap_llm_call(spend_then_fail, WrapOptions(cost_estimate_hint=0.3)
                                 ) == Decision.RETRY
        snap = ctx.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(0.25)
        assert snap.tokens.input == 100 and snap.tokens.by_provider["openai"].output == 20
        assert snap.nodes[0].status == "error" and snap.nodes[0].retries_used == 1


def test_estimate_is_charged_when_nothing_is_reported(coord: Coordinator) -> None:
    with ExecutionContext(config()) as ctx:
        ctx.wrap_llm_call(lambda: "plain text", WrapOptions(cost_estimate_hint=0.03))
        # a response that carries usage and a cost (LiteLLM style) is read instead
        response = {"model": "gpt-4o", "usage": {"prompt_tokens": 10, "completion_tokens": 5},
                    "_hidden_params": {"response_cost": 0.001}}
        ctx.wrap_llm_call(lambda: response, WrapOptions(cost_estimate_hint=0.03))
        snap = ctx.get_snapshot()
        assert [n.cost_usd for n in snap.nodes] == [pytest.approx(0.03), pytest.approx(0.001)]
        assert snap.tokens.total == 15


def test_estimate_that_does_not_fit_is_refused_without_stopping(coord: Coordinator) -> None:
    with ExecutionContext(config(max_cost_usd=0.10)) as ctx:
        ran = []
        assert ctx.wrap_llm_call(lambda: ran.append(1), WrapOptions(cost_estimate_hint=0.2)
                                 ) == Decision.HALT
        assert ran == []
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.05),
                                 WrapOptions(cost_estimate_hint=0.05)) == Decision.ALLOW
        snap = ctx.get_snapshot()
        assert not snap.aborted and snap.events[0].event_type == "budget_exceeded"
        assert "usd needs $0.20, $0.10 of $0.10 left" in snap.events[0].reason


def test_underestimate_overshoots_once_then_halts(coord: Coordinator) -> None:
    with ExecutionContext(config(max_cost_usd=0.10)) as ctx:
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.15),
                                 WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        snap = ctx.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(0.15)
        assert snap.abort_reason == "budget_exceeded"


def test_timeout_halts_and_cancels_running_coroutine(coord: Coordinator) -> None:
    async def main() -> tuple[Decision, float]:
        ctx = ExecutionContext(config(timeout_ms=300))
        started = time.monotonic()
        decision = await ctx.awrap_llm_call(lambda: asyncio.sleep(30))
        elapsed = time.monotonic() - started
        ctx.close()
        return decision, elapsed

    decision, elapsed = asyncio.run(main())
    assert decision == Decision.HALT
    assert elapsed < 10


def test_deadline_is_checked_in_redis_time(coord: Coordinator) -> None:
    ctx = ExecutionContext(config(timeout_ms=200))
    time.sleep(0.35)
    ran = []
    assert ctx.wrap_llm_call(lambda: ran.append(1)) == Decision.HALT
    assert ran == []
    snap = ctx.get_snapshot()
    assert snap.abort_reason == "timeout" and snap.aborted
    assert snap.deadline is not None
    assert ctx.cancellation_token.cancelled and ctx.cancellation_token.reason == "timeout"
    ctx.close()


def test_per_call_timeout_cancels_the_call_only(coord: Coordinator) -> None:
    def slow() -> None:
        tok = current_cancellation_token()
        assert tok is not None
        tok.wait(10)
        tok.raise_if_cancelled()

    with ExecutionContext(config()) as ctx:
        assert ctx.wrap_tool_call(slow, WrapOptions(timeout_ms=100)) == Decision.HALT
        assert ctx.wrap_tool_call(lambda: None) == Decision.ALLOW
        snap = ctx.get_snapshot()
        assert [n.status for n in snap.nodes] == ["timeout", "ok"]
        assert not snap.aborted


def test_abort_in_process_cancels_coroutine(coord: Coordinator) -> None:
    async def main() -> Decision:
        ctx = ExecutionContext(config())
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, ctx.abort, "user cancelled")
        decision = await ctx.awrap_llm_call(lambda: asyncio.sleep(30))
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        ctx.close()
        return decision

    assert asyncio.run(main()) == Decision.HALT


class _Recorder:
    def __init__(self, name: str, log: list[str], decision: Decision = Decision.ALLOW) -> None:
        self.name, self.log, self.decision = name, log, decision

    def before_llm_call(self, ctx: ToolCallContext) -> Decision:
        self.log.append(f"{self.name}.before_llm_call:{ctx.operation_name}")
        return self.decision

    def before_charge(self, ctx: ToolCallContext, cost_usd: float) -> Decision:
        self.log.append(f"{self.name}.before_charge:{cost_usd}")
        return Decision.ALLOW

    def on_error(self, ctx: ToolCallContext, error: BaseException) -> None:
        self.log.append(f"{self.name}.on_error:{error}")


def test_pipeline_is_consulted_after_limits_in_spec_order(coord: Coordinator) -> None:
    log: list[str] = []
    pipeline = ShieldPipeline(_Recorder("a", log))
    meta = ChainMetadata(request_id="r1", chain_id="c-pipeline", service="svc")
    with ExecutionContext(config(max_steps=2), pipeline=pipeline, metadata=meta) as ctx:
        ctx.wrap_llm_call(lambda: log.append("fn") or report_usage(cost_usd=0.5),
                          WrapOptions(operation_name="op"))
        ctx.wrap_llm_call(boom, WrapOptions(operation_name="op2"))
        ctx.wrap_llm_call(lambda: None, WrapOptions(operation_name="op3"))
        ctx.wrap_llm_call(lambda: None, WrapOptions(operation_name="op4"))
    assert log == ["a.before_llm_call:op", "fn", "a.before_charge:0.5",
                   "a.before_llm_call:op2", "a.on_error:provider 503",
                   "a.before_llm_call:op3", "a.before_charge:0.0001"]  # op4: limits first


class _HaltOnCharge:
    def __init__(self) -> None:
        self.charged: list[tuple[str, float]] = []

    def before_charge(self, ctx: ToolCallContext, cost_usd: float) -> Decision:
        self.charged.append(("before_charge", cost_usd))
        return Decision.HALT

    def on_charge(self, ctx: ToolCallContext, cost_usd: float) -> None:
        self.charged.append(("on_charge", cost_usd))


def test_before_charge_judges_llm_calls_only(coord: Coordinator) -> None:
    """The reference asks before_charge of LLM calls only: a tool call that ran (and was
    charged) is not turned into a HALT; hooks learn its cost through on_charge."""
    hook = _HaltOnCharge()
    with ExecutionContext(config(), pipeline=ShieldPipeline(hook)) as ctx:
        assert ctx.wrap_tool_call(lambda: report_usage(cost_usd=0.25)) == Decision.ALLOW
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.5)) == Decision.HALT
        snap = ctx.get_snapshot()
    assert hook.charged == [("on_charge", 0.25), ("before_charge", 0.5)]
    assert snap.cost_usd_accumulated == pytest.approx(0.75)  # both ran and were charged


def test_pipeline_halt_skips_fn_and_is_mirrored(coord: Coordinator) -> None:
    log: list[str] = []
    pipeline = ShieldPipeline(_Recorder("deny", log, Decision.DEGRADE))
    with ExecutionContext(config(), pipeline=pipeline) as ctx:
        ran = []
        assert ctx.wrap_llm_call(lambda: ran.append(1)) == Decision.DEGRADE
        assert ran == []
        snap = ctx.get_snapshot()
        assert snap.step_count == 0 and snap.cost_usd_reserved == 0
        assert [e.hook for e in snap.events] == ["_Recorder"]
        assert pipeline.get_events()[0].decision == Decision.DEGRADE


def test_record_event_and_load_snapshot_after_forced_stop(coord: Coordinator) -> None:
    meta = ChainMetadata(request_id="r2", chain_id="c-load")
    ctx = ExecutionContext(config(max_steps=1), metadata=meta)
    ctx.record_event(SafetyEvent(event_type="custom", decision=Decision.ALLOW,
                                 reason="note", hook="app"))
    ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01))
    ctx.wrap_llm_call(lambda: None)
    snap = ExecutionContext.load_snapshot("c-load")
    assert snap.step_count == 1 and snap.abort_reason == "step_limit_exceeded"
    assert [e.event_type for e in snap.events][:2] == ["custom", "step_limit_exceeded"]
    ctx.close()
    with pytest.raises(ContextNotFoundError):
        ExecutionContext.load_snapshot("no-such-chain")


def test_chain_ids_are_unique(coord: Coordinator) -> None:
    meta = ChainMetadata(request_id="r", chain_id="dup")
    with ExecutionContext(config(), metadata=meta):
        with pytest.raises(ContextExistsError):
            ExecutionContext(config(), metadata=meta)


def test_spawn_child_defaults_follow_the_linking_spec(coord: Coordinator) -> None:
    with ExecutionContext(config(max_cost_usd=1.0, max_steps=40, max_retries_total=7)) as p:
        p.wrap_llm_call(lambda: report_usage(cost_usd=0.3))
        child = p.spawn_child()
        assert child.config.max_cost_usd == pytest.approx(0.7)  # the parent's remaining
        assert (child.config.max_steps, child.config.max_retries_total) == (40, 7)
        tight = p.spawn_child(max_cost_usd=5.0, max_steps=3)
        snap = tight.get_snapshot()
        assert snap.max_cost_usd == pytest.approx(0.7) and "max_cost_usd" in snap.clamped
        assert snap.max_steps == 3 and snap.parent_chain_id == p.chain_id
        child.close()
        tight.close()


def test_current_context_inside_wrapped_call(coord: Coordinator) -> None:
    seen = []
    with ExecutionContext(config()) as ctx:
        assert current_context() is ctx
        ctx.wrap_tool_call(lambda: seen.append(current_context()))
    assert seen == [ctx]
    assert current_context() is None


def test_token_attach_and_tamper(coord: Coordinator) -> None:
    with ExecutionContext(config()) as ctx:
        handle = ExecutionContext.attach(ctx.token)
        handle.wrap_llm_call(lambda: report_usage(cost_usd=0.2))
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.2)
        body, sig = ctx.token.split(".")
        forged = body + "." + ("A" if sig[0] != "A" else "B") + sig[1:]
        with pytest.raises(TokenSignatureError):
            ExecutionContext.attach(forged)
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.2)
        handle.close()
        assert ctx.wrap_llm_call(lambda: None) == Decision.ALLOW  # a handle does not close


def test_closed_context_halts_its_subtree(coord: Coordinator) -> None:
    ctx = ExecutionContext(config())
    child = ctx.spawn_child()
    ctx.close()
    assert child.wrap_llm_call(lambda: None) == Decision.HALT
    assert child.get_snapshot().status == "closed"
    child.close()


def test_a_signed_token_with_a_forged_path_is_refused(coord: Coordinator) -> None:
    from coordinator.errors import TokenMalformedError

    with ExecutionContext(config(max_cost_usd=0.1)) as root:
        child = root.spawn_child()
        # signed with the right key, but claiming the child hangs directly off... itself
        forged = coord.token_codec().encode(
            root=root.chain_id, path=(root.chain_id, "x", child.chain_id),
            tenant="", ttl_s=60, now=time.time())
        with pytest.raises(TokenMalformedError):
            ExecutionContext.attach(forged)
        child.close()


def test_replayed_work_is_not_charged_twice(coord: Coordinator) -> None:
    runs: list[str] = []

    def call(name: str, usd: float) -> Callable[[], None]:
        def body() -> None:
            runs.append(name)
            report_usage(cost_usd=usd)
        return body

    with ExecutionContext(config(max_cost_usd=1.0)) as root:
        task = root.spawn_child(metadata=ChainMetadata(request_id="t", chain_id="task-1"))
        # first delivery: call A settles, call B is in flight when the worker dies
        first = ExecutionContext.attach(task.token)
        first.enable_call_keys()
        assert first.wrap_llm_call(call("A", 0.10), WrapOptions(cost_estimate_hint=0.1)
                                   ) == Decision.ALLOW
        coord.store.flush()
        held = coord.store.reserve(first._path, "task-1:1",
                                   ["usd", 200_000, "steps", 1], keyed=True)
        assert not hasattr(held, "reason")
        # redelivery: the same calls in the same order
        second = ExecutionContext.attach(task.token)
        second.enable_call_keys()
        assert second.wrap_llm_call(call("A", 0.10), WrapOptions(cost_estimate_hint=0.1)
                                    ) == Decision.ALLOW
        assert second.wrap_llm_call(call("B", 0.15), WrapOptions(cost_estimate_hint=0.2)
                                    ) == Decision.ALLOW
        assert second.evaluate(call("C", 0.05)) is None
        assert runs == ["A", "B", "C"]  # A was not run again
        snap = task.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(0.30)  # A once, B settled once
        assert snap.step_count == 3 and snap.cost_usd_reserved == 0
        third = ExecutionContext.attach(task.token)
        third.enable_call_keys()
        assert [third.wrap_llm_call(call(n, 1.0)) for n in "ABC"] == [Decision.ALLOW] * 3
        assert runs == ["A", "B", "C"]
        assert task.get_snapshot().cost_usd_accumulated == pytest.approx(0.30)
        for h in (first, second, third, task):
            h.close()
    check_tree(coord.client, root.chain_id)


def test_a_replayed_call_that_raised_halts_instead_of_going_on(coord: Coordinator) -> None:
    runs: list[str] = []

    def broken() -> None:
        runs.append("run")
        raise KeyError("not retryable")

    with ExecutionContext(config()) as root:
        task = root.spawn_child(metadata=ChainMetadata(request_id="t", chain_id="task-r"))
        first = ExecutionContext.attach(task.token)
        first.enable_call_keys()
        with pytest.raises(KeyError):
            first.wrap_llm_call(broken, WrapOptions(cost_estimate_hint=0.01,
                                                    retry_on=(TimeoutError,)))
        assert first.wrap_llm_call(lambda: None) == Decision.ALLOW
        coord.store.flush()
        again = ExecutionContext.attach(task.token)  # the work redelivered
        again.enable_call_keys()
        outcome = run_sync(again._state, again, "llm", broken, WrapOptions())
        assert (outcome.decision, outcome.reason) == (Decision.HALT, "replayed")
        assert "halted" in outcome.detail
        assert again.wrap_llm_call(lambda: None) == Decision.ALLOW  # it returned
        assert runs == ["run"] and task.get_snapshot().step_count == 2
        for h in (first, again, task):
            h.close()
    check_tree(coord.client, root.chain_id)


def test_a_replayed_call_whose_worker_died_is_not_run_again(coord: Coordinator) -> None:
    runs: list[str] = []
    with ExecutionContext(config()) as root:
        task = root.spawn_child(metadata=ChainMetadata(request_id="t", chain_id="task-l"))
        first = ExecutionContext.attach(task.token)
        first.enable_call_keys()
        coord.store.reserve(first._path, "task-l:0", ["usd", 10_000, "steps", 1], keyed=True)
        coord.client.zadd(coord.keyspace.leases(root.root_id), {"task-l:0": 0})  # lapsed
        assert root.wrap_llm_call(lambda: None) == Decision.ALLOW  # its reserve reaps it
        coord.store.flush()
        assert [n.status for n in task.get_snapshot().nodes] == ["lost"]
        again = ExecutionContext.attach(task.token)
        again.enable_call_keys()
        assert again.wrap_llm_call(lambda: runs.append("run")) == Decision.ALLOW
        assert runs == [] and task.get_snapshot().cost_usd_accumulated == pytest.approx(0.01)
        for h in (first, again, task):
            h.close()
    check_tree(coord.client, root.chain_id)


def test_models_take_the_specifications_positional_signatures() -> None:
    assert ExecutionConfig(0.5, 10, 3, 15_000) == ExecutionConfig(
        max_cost_usd=0.5, max_steps=10, max_retries_total=3, timeout_ms=15_000)
    assert ChainMetadata("req", "chain", "acme").org_id == "acme"
    assert WrapOptions("summarise", 0.02).cost_estimate_hint == 0.02
    with pytest.raises(TypeError):
        ExecutionConfig(0.5, 10, 3, max_cost_usd=1.0)


def test_detach_leaves_the_context_open_with_expiring_keys(coord: Coordinator) -> None:
    with ExecutionContext(config()) as root:
        mid = root.spawn_child()
        token = mid.token
        mid.detach()  # e.g. a task that sent sub-tasks and returned
        assert coord.client.ttl(coord.keyspace.ctx(root.chain_id, mid.chain_id)) > 0
        late = ExecutionContext.spawn_from_token(token)
        assert late.wrap_llm_call(lambda: report_usage(cost_usd=0.1)) == Decision.ALLOW
        assert ExecutionContext.load_snapshot(mid.chain_id).status == "running"
        late.close()
    assert late.wrap_llm_call(lambda: None) == Decision.HALT  # the root's close ends it
    assert ExecutionContext.load_snapshot(mid.chain_id).status == "closed"
