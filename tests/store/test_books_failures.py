"""Failures keep their reason and caller bugs raise at once (issue 25 item 5); one
refusal, one name (item 7)."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
    TokenBudgetExceededError,
    WrapOptions,
    report_usage,
)
from coordinator.errors import (
    BudgetCoordinatorError,
    InvalidConfigError,
    NotAwaitableError,
    ReportOutsideCallError,
)
from coordinator.shield.windows import BudgetWindowHook
from tests.support.invariants import check_tree

CAP = ExecutionConfig(max_cost_usd=0.05, max_steps=5, max_retries_total=2)
ROOMY = ExecutionConfig(max_cost_usd=10.0, max_steps=100, max_retries_total=20)


def _events(ctx: ExecutionContext, event_type: str) -> list[Any]:
    return [e for e in ctx.get_snapshot().events if e.event_type == event_type]


# -- 5. failures keep their reason; bugs raise ---------------------------------------------

def test_a_failed_call_keeps_its_error_and_records_call_failed(coord: Coordinator) -> None:
    def fails(exc: Exception) -> None:
        raise exc

    ctx = ExecutionContext(ROOMY, coordinator=coord)
    for exc in (ValueError("provider 503: " + "x" * 900), ValueError("again"),
                KeyError("missing")):
        assert ctx.wrap_llm_call(partial(fails, exc)) == Decision.RETRY
    snap = ctx.get_snapshot()
    first = snap.nodes[0]
    assert (first.status, first.error_type, first.retries_used) == ("error", "ValueError", 1)
    assert first.error_message.startswith("provider 503: ") and len(first.error_message) == 500
    failed = _events(ctx, "call_failed")
    assert sorted(e.metadata["error_type"] for e in failed) == ["KeyError", "ValueError"]
    assert snap.calls == {"error": 3}
    assert snap.cost_usd_accumulated == 0  # failed requests that reported nothing
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def _needs_an_argument(query: str) -> str:
    return query


def test_caller_bugs_raise_at_once_and_spend_no_retry(coord: Coordinator) -> None:
    ctx = ExecutionContext(CAP, coordinator=coord)  # a retry budget of 2
    for _ in range(3):
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            ctx.wrap_llm_call(_needs_an_argument)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            ctx.wrap_llm_call(partial(_needs_an_argument, "a", "b"))

    def not_awaitable() -> int:
        return 42

    for _ in range(3):
        with pytest.raises(NotAwaitableError) as err:
            asyncio.run(ctx.awrap_llm_call(not_awaitable))  # type: ignore[arg-type]
        assert isinstance(err.value, TypeError) and "returned a int" in str(err.value)
    snap = ctx.get_snapshot()
    assert snap.status == "running" and snap.retries_used == 0
    assert snap.step_count == 3  # the non-awaitable function ran: a step each
    assert {n.error_type for n in snap.nodes} == {"TypeError", None}
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_a_type_error_inside_the_function_is_a_retryable_failure(coord: Coordinator) -> None:
    ctx = ExecutionContext(ROOMY, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: _needs_an_argument()) == Decision.RETRY  # type: ignore
    assert ctx.get_snapshot().retries_used == 1
    ctx.close()


def test_report_usage_outside_a_call_raises_a_typed_error(coord: Coordinator) -> None:
    with pytest.raises(ReportOutsideCallError) as err:
        report_usage(cost_usd=0.01)
    assert isinstance(err.value, BudgetCoordinatorError)

    def reports_from_a_thread() -> None:
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: _capture(errors, lambda: report_usage(
            cost_usd=0.01)))
        t.start()
        t.join()
        raise errors[0]

    ctx = ExecutionContext(CAP, coordinator=coord)
    for _ in range(3):  # more than the retry budget: no retry is spent
        with pytest.raises(ReportOutsideCallError):
            ctx.wrap_llm_call(reports_from_a_thread)
    snap = ctx.get_snapshot()
    assert (snap.retries_used, snap.step_count, snap.status) == (0, 3, "running")
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def _capture(errors: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        errors.append(exc)


def test_retry_on_names_the_retryable_errors(coord: Coordinator) -> None:
    def fails(exc: Exception) -> None:
        report_usage(cost_usd=0.001)
        raise exc

    ctx = ExecutionContext(ROOMY, coordinator=coord)
    opts = WrapOptions(retry_on=(ConnectionError,), retry_policy_override=1)
    assert ctx.wrap_llm_call(partial(fails, ConnectionError("reset")), opts) == Decision.RETRY
    with pytest.raises(ValueError, match="bad prompt"):
        ctx.wrap_llm_call(partial(fails, ValueError("bad prompt")), opts)
    snap = ctx.get_snapshot()
    # two runs of the retryable one (a retry each), one of the other (a step)
    assert (snap.retries_used, snap.step_count) == (2, 1)
    assert snap.cost_usd_accumulated == pytest.approx(0.003)
    assert [e.metadata["error_type"] for e in _events(ctx, "call_failed")] == [
        "ConnectionError", "ValueError"]
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_a_tool_giving_up_on_a_limit_counts_a_step(coord: Coordinator) -> None:
    def greedy_tool() -> None:
        raise TokenBudgetExceededError("needs 5000 tokens")

    ctx = ExecutionContext(ROOMY, coordinator=coord)
    assert ctx.wrap_tool_call(greedy_tool) == Decision.HALT
    snap = ctx.get_snapshot()
    assert (snap.step_count, snap.retries_used, snap.calls) == (1, 0, {"halted": 1})
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_retry_on_accepts_only_exception_types() -> None:
    with pytest.raises(InvalidConfigError):
        WrapOptions(retry_on=("ValueError",))  # type: ignore[arg-type]


# -- 7. one refusal, one name --------------------------------------------------------------

@pytest.mark.parametrize("attach", ["pipeline=", "ShieldPipeline(hook)", "add_hook"])
def test_a_window_refusal_has_one_name_however_the_hook_was_attached(
        coord: Coordinator, attach: str) -> None:
    pipeline = ShieldPipeline()
    window = partial(BudgetWindowHook, scope="org", max_calls=1, window_s=60,
                     coordinator=coord)
    if attach == "pipeline=":
        window(pipeline=pipeline)
    elif attach == "add_hook":
        pipeline.add_hook(window())
    else:
        pipeline = ShieldPipeline(window())
    ctx = ExecutionContext(ROOMY, coordinator=coord, pipeline=pipeline)
    assert ctx.wrap_llm_call(lambda: None) == Decision.ALLOW
    assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
    types = [e.event_type for e in ctx.get_snapshot().events]
    assert types == ["provider_rate_limit"]
    ctx.close()
