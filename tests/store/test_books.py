"""No call escapes the books (issue 25 items 1 and 2): a call that ran is charged and
counted whatever it reported (invalid reports, unknown models, nothing), by the rule of
docs/tokens.md. Failures and refusals: test_books_failures.py; counts: test_books_counts.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.charging_rules import DEFAULT_FLOOR_USD, ChargingPolicy
from coordinator.errors import (
    InvalidConfigError,
    InvalidCostError,
)
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS

CAP = ExecutionConfig(max_cost_usd=0.05, max_steps=5, max_retries_total=2)
ROOMY = ExecutionConfig(max_cost_usd=10.0, max_steps=100, max_retries_total=20)


@pytest.fixture
def charging(redis_url: str) -> Iterator[Any]:
    """Coordinators with a charging policy of the test's choice."""
    made: list[Coordinator] = []

    def make(**policy: Any) -> Coordinator:
        c = Coordinator.from_url(redis_url, token_keys=TEST_KEYS,
                                 charging=ChargingPolicy(**policy))
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
        c.client.close()


def _events(ctx: ExecutionContext, event_type: str) -> list[Any]:
    return [e for e in ctx.get_snapshot().events if e.event_type == event_type]


# -- 1. an invalid report is charged and counted ----------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), -1.0, 1e12])
def test_an_invalid_cost_report_is_charged_counted_and_stops_a_loop(
        coord: Coordinator, bad: float) -> None:
    ran: list[int] = []

    def fn() -> None:
        ran.append(1)
        report_usage(cost_usd=bad)

    ctx = ExecutionContext(CAP, coordinator=coord)
    decisions = []
    for _ in range(50):
        try:
            decisions.append(ctx.wrap_llm_call(fn))
        except InvalidCostError:
            decisions.append("raised")
    snap = ctx.get_snapshot()
    # each run counted a retry and was charged the floor: the retry budget (2) stops it
    assert len(ran) == 2 and decisions[:2] == ["raised", "raised"]
    assert set(decisions[2:]) == {Decision.HALT}
    assert (snap.retries_used, snap.step_count) == (2, 0)
    assert snap.abort_reason == "retry_budget_exceeded"
    assert snap.cost_usd_accumulated == pytest.approx(2 * DEFAULT_FLOOR_USD)
    runs = [n for n in snap.nodes if n.status == "error"]
    assert [(n.retries_used, n.charged_by, n.error_type) for n in runs] == [
        (1, "floor", "InvalidCostError")] * 2
    (event,) = _events(ctx, "invalid_usage")  # once per context and error type
    assert "InvalidCostError" in event.reason and "floor" in event.reason
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_an_invalid_report_is_charged_its_estimate_even_when_caught(
        coord: Coordinator) -> None:
    def swallows() -> str:
        try:
            report_usage(cost_usd=float("nan"))
        except InvalidCostError:
            pass
        return "done"

    ctx = ExecutionContext(ROOMY, coordinator=coord)
    assert ctx.wrap_llm_call(swallows, WrapOptions(cost_estimate_hint=0.03)) == Decision.ALLOW
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.03) and snap.step_count == 1
    assert snap.nodes[-1].charged_by == "estimate"
    assert len(_events(ctx, "invalid_usage")) == 1
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


# -- 2. unpriced usage is never free or silent ---------------------------------------------

def _typo() -> None:
    report_usage(input_tokens=100_000, output_tokens=100_000, model="gpt-4o-typo")


def test_tokens_of_an_unknown_model_are_charged_the_floor_and_named(
        coord: Coordinator) -> None:
    ctx = ExecutionContext(CAP, coordinator=coord)
    for _ in range(5):
        assert ctx.wrap_llm_call(_typo) == Decision.ALLOW
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(5 * DEFAULT_FLOOR_USD)
    assert {n.charged_by for n in snap.nodes} == {"floor"}
    (event,) = _events(ctx, "usage_unpriced")  # once per (context, model)
    assert event.metadata["model"] == "gpt-4o-typo" and "gpt-4o-typo" in event.reason
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_tokens_of_an_unknown_model_are_charged_the_estimate(coord: Coordinator) -> None:
    ctx = ExecutionContext(CAP, coordinator=coord)
    child = ctx.spawn_child()
    assert child.wrap_llm_call(_typo, WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
    child.wrap_llm_call(lambda: report_usage(input_tokens=5, model="other-typo"),
                        WrapOptions(cost_estimate_hint=0.002))
    assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.012)
    models = sorted(e.metadata["model"] for e in _events(child, "usage_unpriced"))
    assert models == ["gpt-4o-typo", "other-typo"]
    assert _events(ctx, "usage_unpriced") == []  # the child's event, on the child
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_a_fallback_price_per_token_charges_unpriced_tokens(charging: Any) -> None:
    coord = charging(unpriced_usd_per_token=1e-7)  # 200,000 tokens: $0.02 a call
    ctx = ExecutionContext(CAP, coordinator=coord)
    decisions = [ctx.wrap_llm_call(_typo) for _ in range(5)]
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT] * 2
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.06)  # no estimate: past by one call
    assert snap.abort_reason == "budget_exceeded"
    assert {n.charged_by for n in snap.nodes if n.status == "ok"} == {"fallback_price"}
    ctx.close()


def test_strict_pricing_refuses_an_unpriced_model_before_it_runs(charging: Any) -> None:
    coord = charging(pricing="strict")
    ctx = ExecutionContext(CAP, coordinator=coord)
    ran: list[str] = []
    decision = ctx.wrap_llm_call(lambda: ran.append("typo"), WrapOptions(model="gpt-4o-typo"))
    assert decision == Decision.HALT and ran == []
    assert ctx.wrap_llm_call(lambda: ran.append("known"),
                             WrapOptions(model="gpt-4o-mini")) == Decision.ALLOW
    assert ran == ["known"]
    snap = ctx.get_snapshot()
    assert snap.refusals == {"unpriced_model": 1} and snap.calls == {"ok": 1, "refused": 1}
    assert "gpt-4o-typo" in _events(ctx, "unpriced_model")[0].reason
    ctx.close()


def test_an_llm_call_reporting_nothing_without_an_estimate_is_charged_the_floor(
        charging: Any) -> None:
    coord = charging(floor_usd=0.002)
    ctx = ExecutionContext(ROOMY, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: "no usage") == Decision.ALLOW
    assert ctx.wrap_tool_call(lambda: "a local tool") == Decision.ALLOW  # free, unmarked
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) \
        == Decision.ALLOW  # its estimate, unmarked
    snap = ctx.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.012)
    assert [n.unreported for n in snap.nodes] == [True, False, False]
    assert snap.unreported_calls == 1 and snap.calls == {"ok": 3}
    ctx.close()
    check_tree(coord.client, ctx.chain_id)


def test_an_llm_call_without_an_estimate_holds_the_floor(coord: Coordinator) -> None:
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=3 * DEFAULT_FLOOR_USD, max_steps=50,
                                           max_retries_total=5), coordinator=coord)
    decisions = [ctx.wrap_llm_call(lambda: None) for _ in range(5)]
    assert decisions == [Decision.ALLOW] * 3 + [Decision.HALT] * 2
    assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(3 * DEFAULT_FLOOR_USD)
    ctx.close()
    check_tree(coord.client, ctx.chain_id)  # at the ceiling, never past it


@pytest.mark.parametrize("policy", [{"pricing": "loose"}, {"floor_usd": -1},
                                    {"floor_usd": float("nan")},
                                    {"unpriced_usd_per_token": "1e-6"}])
def test_a_charging_policy_with_impossible_values_is_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError):
        ChargingPolicy(**policy)
