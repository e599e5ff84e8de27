"""Model ladders in strict mode (docs/degrade.md): reserve.lua holds the first rung that
fits while enough of every ceiling remains, the cheapest that fits below that, and
refuses as today when none fits; the call runs, is charged and recorded at the model
that ran; processes racing at the threshold cannot overshoot or all take the expensive
rung."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    Degrade,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_call,
    report_usage,
    set_price,
)
from coordinator.core import pricing
from coordinator.core.charging_rules import ChargingPolicy
from coordinator.errors import InvalidConfigError
from tests.support import edge_procs
from tests.support.invariants import check_tree
from tests.support.together import run_together

LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.5)
GPT4O = edge_procs.LADDER_CALL
FULL, MINI = 12_500, 750  # micro-USD: gpt-4o and gpt-4o-mini at 1,000 tokens each way


def _root(usd: float = 0.10, **edge: Any) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=1000,
                                            max_retries_total=5, degrade=LADDER, **edge))


def _ran_on(ctx: ExecutionContext, options: WrapOptions = GPT4O, report: bool = True
            ) -> tuple[Decision, str | None]:
    seen: list[str | None] = []

    def call() -> None:
        info = current_call()
        assert info is not None and info.requested_model == options.model
        seen.append(info.model)
        if report:
            report_usage(input_tokens=1000, output_tokens=1000, model=info.model)

    decision = ctx.wrap_llm_call(call, options)
    return decision, seen[0] if seen else None


def _books(coord: Coordinator, root: ExecutionContext) -> int:
    """The tree's books checked once what this process wrote behind has landed (a
    snapshot read carries it): the root's micro-USD."""
    root.get_snapshot()
    return check_tree(coord.client, root.root_id)


def test_the_prices_these_tests_rely_on() -> None:
    for model, micro in (("gpt-4o", FULL), ("gpt-4o-mini", MINI)):
        usd = pricing.price_usd(model, 1000, 1000, provider="openai")
        assert usd is not None and round(usd * 1_000_000) == micro


def test_calls_run_on_the_requested_model_while_half_remains_then_on_the_cheaper(
        coord: Coordinator) -> None:
    root = _root()
    ran = []
    while (result := _ran_on(root))[0] == Decision.ALLOW:
        ran.append(result[1])
    # gpt-4o while at least $0.05 remained before the call: 5 calls ($0.0625 spent)
    assert ran == ["gpt-4o"] * 5 + ["gpt-4o-mini"] * ((100_000 - 5 * FULL) // MINI)
    snap = root.get_snapshot()
    assert round(snap.cost_usd_accumulated * 1e6) == 5 * FULL + ran.count("gpt-4o-mini") * MINI
    assert snap.nodes[-1].stop_reason == "budget_exceeded"  # the mini spent it all
    ok = [n for n in snap.nodes if n.status == "ok"]
    assert [n.model for n in ok] == ran
    assert all(n.degraded_from == ("gpt-4o" if n.model == "gpt-4o-mini" else None) for n in ok)
    assert [round(n.cost_usd * 1e6) for n in ok] == [FULL if m == "gpt-4o" else MINI
                                                    for m in ran]
    degraded = [e for e in snap.events if e.event_type == "degraded"]
    assert len(degraded) == 1
    assert degraded[0].metadata["from_model"] == "gpt-4o"
    assert degraded[0].metadata["to_model"] == "gpt-4o-mini"
    assert _books(coord, root) <= 100_000


def test_a_request_whose_model_does_not_fit_runs_on_a_rung_that_does(
        coord: Coordinator) -> None:
    root = _root(usd=0.01)  # gpt-4o's worst case ($0.0125) can never fit; the mini's can
    assert _ran_on(root) == (Decision.ALLOW, "gpt-4o-mini")
    node = root.get_snapshot().nodes[-1]
    assert (node.model, node.degraded_from, node.cost_usd) == ("gpt-4o-mini", "gpt-4o",
                                                               MINI / 1e6)


def test_above_the_threshold_the_requested_model_runs_when_it_fits(coord: Coordinator) -> None:
    root = _root(usd=1.0)
    assert [_ran_on(root)[1] for _ in range(3)] == ["gpt-4o"] * 3
    assert not [e for e in root.get_snapshot().events if e.event_type == "degraded"]


def test_when_no_rung_fits_the_call_is_refused_as_the_cheapest_would_be(
        coord: Coordinator) -> None:
    root = _root(usd=0.0005)  # less than the mini's worst case
    decision, ran = _ran_on(root)
    assert (decision, ran) == (Decision.HALT, None)
    node = root.get_snapshot().nodes[-1]
    assert node.stop_reason == "budget_exceeded"
    assert "needs $0.00075" in node.stop_detail
    assert root.stop_reason is None  # only this call did not fit


def test_a_child_is_degraded_by_its_parents_ceiling_and_inherits_the_ladder(
        coord: Coordinator) -> None:
    root = _root(usd=0.10)
    child = root.spawn_child(max_cost_usd=0.08)
    assert child.config.degrade == LADDER
    root_call = WrapOptions(cost_estimate_hint=0.06)
    assert root.wrap_llm_call(lambda: report_usage(cost_usd=0.06), root_call) == Decision.ALLOW
    # the root has $0.04 of $0.10 left (< half): the child's call degrades, though the
    # child itself has all of its $0.08 left
    assert _ran_on(child)[1] == "gpt-4o-mini"
    assert _books(coord, root) == 60_000 + MINI


def test_a_model_outside_every_ladder_is_reserved_as_before(coord: Coordinator) -> None:
    root = _root(usd=0.01)
    options = WrapOptions(model="gpt-4o-mini", provider="openai", cost_estimate_hint=0.001)
    assert _ran_on(root, options) == (Decision.ALLOW, "gpt-4o-mini")
    assert root.get_snapshot().nodes[-1].degraded_from is None


def test_an_attached_handle_uses_the_ladder_of_the_context(coord: Coordinator) -> None:
    root = _root(usd=0.01)
    attached = ExecutionContext.attach(root.token, coordinator=coord)
    assert attached.config.degrade == LADDER
    assert _ran_on(attached)[1] == "gpt-4o-mini"


@pytest.mark.slow
def test_four_processes_racing_at_the_threshold_cannot_all_take_the_expensive_rung(
        coord: Coordinator, redis_url: str) -> None:
    root = _root()
    models = [m for ran in run_together(edge_procs.run_ladder_calls, (redis_url, root.token))
              for m in ran]
    # each gpt-4o call was held while at least $0.05 remained, counting every hold in
    # flight: exactly as many as one process alone gets, however the four raced
    assert models.count("gpt-4o") == 5
    assert models.count("gpt-4o-mini") == (100_000 - 5 * FULL) // MINI
    spent = _books(coord, root)  # exact books, nothing held
    assert spent == 5 * FULL + models.count("gpt-4o-mini") * MINI <= 100_000
    snap = root.get_snapshot()
    assert len([e for e in snap.events if e.event_type == "degraded"]) == 1


@pytest.mark.parametrize("bad", [
    {"below": 1.0}, {"below": -0.1}, {"below": float("nan")}, {"below": "half"},
    {"ladder": {}}, {"ladder": {"gpt-4o": []}}, {"ladder": {"gpt-4o": "gpt-4o-mini"}},
    {"ladder": {"gpt-4o": ["gpt-4o"]}}, {"ladder": {"": ["gpt-4o-mini"]}},
    {"ladder": {"gpt-4o": ["gpt-4o-mini", None]}},
])
def test_bad_ladders_are_refused_with_a_typed_error(bad: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"ladder": {"gpt-4o": ["gpt-4o-mini"]}, **bad}
    with pytest.raises(InvalidConfigError, match="invalid Degrade"):
        Degrade(**settings)


def test_a_ladder_naming_an_unpriced_model_is_refused_before_anything_runs(
        coord: Coordinator) -> None:
    degrade = Degrade(ladder={"gpt-4o": ["no-such-model-xyz"]})
    config = ExecutionConfig(max_cost_usd=1, max_steps=9, max_retries_total=1,
                             degrade=degrade)
    keys_before = coord.client.dbsize()
    with pytest.raises(InvalidConfigError, match="no-such-model-xyz.*has no price"):
        ExecutionContext(config, coordinator=coord)
    assert coord.client.dbsize() == keys_before


def test_under_strict_pricing_the_requested_model_must_be_priced_too(
        redis_url: str) -> None:
    strict = Coordinator(redis.Redis.from_url(redis_url),
                         charging=ChargingPolicy(pricing="strict"))
    try:
        config = ExecutionConfig(max_cost_usd=1, max_steps=9, max_retries_total=1,
                                 degrade=Degrade(ladder={"house-model": ["gpt-4o-mini"]}))
        with pytest.raises(InvalidConfigError, match="house-model"):
            ExecutionContext(config, coordinator=strict)
        set_price("house-model", input_per_mtok=1.0, output_per_mtok=2.0)
        ExecutionContext(config, coordinator=strict).close()
    finally:
        pricing.clear_prices()
        strict.close()
