"""Bad input to the core API gets a clear, typed error, and nothing already recorded is
lost or changed: no counter written in a form the library cannot read back, no
reservation left open, no retry spent on a caller's mistake. (An impossible usage
report is not a mistake to forgive: the call ran, so it counts and is charged.)"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
    report_usage,
)
from coordinator.core.charging_rules import DEFAULT_FLOOR_USD
from coordinator.errors import InvalidConfigError, InvalidCostError, InvalidUsageError
from tests.support.invariants import check_tree

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=5)


def _state(ctx: ExecutionContext) -> tuple[Any, ...]:
    s = ctx.get_snapshot()
    return (s.cost_usd_accumulated, s.step_count, s.retries_used, s.status, s.tokens)


@pytest.mark.parametrize("kwargs", [
    {"max_cost_usd": 1e12}, {"max_cost_usd": 1e-9}, {"max_cost_usd": True},
    {"max_cost_usd": "1.0"}, {"max_steps": 2**63}, {"max_retries_total": 10**30},
    {"timeout_ms": 10**15}, {"deadline": "2099-01-01T00:00:00+00:00"},
    {"token_budget": TokenBudget(total=10**12)},  # the budget itself is fine
])
def test_limits_beyond_any_real_run_are_refused(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"max_cost_usd": 1.0, "max_steps": 5, "max_retries_total": 1,
                            **kwargs}
    if "token_budget" in kwargs:
        ExecutionConfig(**args)  # within the bounds: accepted
        with pytest.raises(InvalidConfigError):
            TokenBudget(total=10**30)
        return
    with pytest.raises(InvalidConfigError):
        ExecutionConfig(**args)


@pytest.mark.parametrize("kwargs", [
    {"cost_estimate_hint": True}, {"cost_estimate_hint": "0.1"},
    {"cost_estimate_hint": 1e12}, {"input_tokens_estimate": 10**30},
    {"max_output_tokens": 2**63}, {"provider": 5}, {"provider": "a,b"},
    {"provider": "x" * 100}, {"model": 5}, {"timeout_ms": 10**15},
])
def test_wrap_options_beyond_any_real_call_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError):
        WrapOptions(**kwargs)


@pytest.mark.parametrize("report", [
    {"input_tokens": 10**30}, {"output_tokens": 2**63}, {"cost_usd": 1e12},
    {"input_tokens": 1e30}, {"input_tokens": 5, "provider": 5},
    {"input_tokens": 5, "provider": ["openai"]}, {"input_tokens": 5, "model": 5},
])
def test_impossible_reports_raise_and_are_charged_the_floor(coord: Coordinator,
                                                            report: dict[str, Any]) -> None:
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.1, input_tokens=10)) \
        == Decision.ALLOW
    with pytest.raises((InvalidCostError, InvalidUsageError)):
        ctx.wrap_llm_call(lambda: report_usage(**report))
    cost, steps, retries, status, tokens = _state(ctx)
    # the call ran: it raised (one retry) and is charged the floor (no estimate), the
    # counters stay readable
    assert (steps, retries, status) == (1, 1, "running")
    assert cost == pytest.approx(0.1 + DEFAULT_FLOOR_USD)
    assert tokens.input == 10
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


class _BrokenResponse:
    @property
    def usage(self) -> Any:
        raise RuntimeError("the SDK object cannot be read")


@pytest.mark.parametrize("response", [
    _BrokenResponse(),
    {"usage": {"prompt_tokens": 10**30, "completion_tokens": 5}},
    {"usage": {"prompt_tokens": 50, "completion_tokens": -5}},
    {"usage": {"input_tokens": "many"}},
    {"cost_usd": math.inf, "usage": {"input_tokens": 5}},
])
def test_a_response_with_unreadable_usage_is_charged_its_estimate(
        coord: Coordinator, response: Any) -> None:
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    opts = WrapOptions(cost_estimate_hint=0.05, input_tokens_estimate=100,
                       max_output_tokens=20)
    with pytest.raises(InvalidUsageError, match=r"it was charged \$0.050000 \(estimate\)"):
        ctx.wrap_llm_call(lambda: response, opts)
    coord.store.flush()
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.05)  # billed, amount unknown
    assert (snap.tokens.input, snap.tokens.output, snap.tokens.reserved) == (100, 20, 0)
    assert (snap.step_count, snap.retries_used) == (1, 0)  # it returned: a step
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_an_invalid_usage_report_raises_and_counts_its_run(coord: Coordinator) -> None:
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    with pytest.raises(InvalidUsageError):  # cache reads beyond the input
        ctx.wrap_llm_call(lambda: report_usage(input_tokens=5, cache_read_input_tokens=10))
    snap = ctx.get_snapshot()
    assert (snap.step_count, snap.retries_used) == (0, 1)
    assert snap.cost_usd_accumulated == pytest.approx(DEFAULT_FLOOR_USD)
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


@pytest.mark.parametrize("fn, options", [
    (None, None), ("not callable", None), (lambda: None, {"cost_estimate_hint": 0.1}),
    (lambda: None, "fast"),
])
def test_wrong_wrap_arguments_raise_before_anything_is_reserved(
        coord: Coordinator, fn: Any, options: Any) -> None:
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    before = _state(ctx)
    with pytest.raises(TypeError):
        ctx.wrap_llm_call(fn, options)
    with pytest.raises(TypeError):
        ctx.evaluate(fn, options)
    assert _state(ctx) == before
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_wrong_context_arguments_raise_typed_errors(coord: Coordinator) -> None:
    with pytest.raises(TypeError):
        ExecutionContext({"max_cost_usd": 1.0}, coordinator=coord)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ExecutionContext(CONFIG, metadata="run-1", coordinator=coord)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ExecutionContext(CONFIG, pipeline="shields", coordinator=coord)  # type: ignore[arg-type]
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    with pytest.raises(TypeError):
        ctx.spawn_child(metadata="child")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        ctx.evaluate(lambda: None, deadline="tomorrow")  # type: ignore[arg-type]
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_abort_needs_a_string_reason_and_keeps_a_bounded_one(coord: Coordinator) -> None:
    ctx = ExecutionContext(CONFIG, coordinator=coord)
    with pytest.raises(TypeError):
        ctx.abort(None)  # type: ignore[arg-type]
    assert ctx.stop_reason is None and ctx.get_snapshot().status == "running"
    ctx.abort("x" * 100_000)
    snap = ctx.get_snapshot()
    assert snap.aborted and snap.abort_reason == "aborted"
    assert max(len(e.reason) for e in snap.events) < 2_000
    ctx.close()


def test_the_token_ledger_refuses_fractions_huge_amounts_and_foreign_reservations(
        coord: Coordinator) -> None:
    budget = TokenBudget(total=10_000)
    ctx = ExecutionContext(CONFIG.model_copy(update={"token_budget": budget}),
                           coordinator=coord)
    other = ctx.spawn_child()
    for kwargs in ({"input_tokens": 1.5}, {"input_tokens": 10**30},
                   {"input_tokens": 5, "provider": 5}):
        with pytest.raises((InvalidCostError, InvalidUsageError)):
            ctx.ledger.reserve(**kwargs)
    held = ctx.ledger.reserve(input_tokens=100, provider="openai")
    with pytest.raises(InvalidCostError):
        ctx.ledger.consume(held, input_tokens=2.5)
    with pytest.raises(InvalidUsageError):  # the settle would roll back another path
        other.ledger.consume(held, input_tokens=50)
    with pytest.raises(InvalidUsageError):
        other.ledger.rollback(held)
    assert ctx.get_snapshot().tokens.reserved == 100
    ctx.ledger.consume(held, input_tokens=60)
    snap = ctx.get_snapshot()
    assert (snap.tokens.input, snap.tokens.reserved) == (60, 0)
    other.close()
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_chain_ids_labels_and_deadlines_are_checked_before_opening(
        coord: Coordinator) -> None:
    for bad in ("a,b", "{x}", "", "x" * 200, "nul\x00"):
        with pytest.raises(InvalidConfigError):
            ChainMetadata(request_id="r", chain_id=bad)
    for labels in ({"team": "x" * 1_000_000}, {"tags": {str(i): "v" for i in range(100_000)}},
                   {"tags": {"k": "v" * 1000}}, {"service": 5}):
        with pytest.raises(InvalidConfigError):
            ChainMetadata(request_id="r", chain_id="c", **labels)
    with pytest.raises(InvalidConfigError):
        WrapOptions(operation_name="x" * 5_000_000)
    with pytest.raises(InvalidConfigError):
        ExecutionConfig(max_cost_usd=1.0, max_steps=1, max_retries_total=1,
                        deadline=datetime(2000, 1, 1, tzinfo=timezone.utc))
