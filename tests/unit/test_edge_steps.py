"""The edge of a budget in a call's first steps, with scripted replies (no Redis): the
terms a reserve carries (final, the model ladder's rungs and worst cases), the rung
reserve.lua chose becoming the model the call runs on, and a final-reserve refusal that
stops nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator import Decision, Degrade, WrapOptions, current_call
from coordinator.context.call import Call, Outcome, begin
from coordinator.context.edge import edge_terms, finishing, worst_case
from coordinator.context.state import ContextState
from coordinator.context.steps import drive
from coordinator.core.amounts import usd_to_micro
from coordinator.core.pricing import price_usd
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.replies import Held, Refused
from coordinator.store.requests import PLAIN, EdgeTerms, Refusal, Reserve
from tests.unit.scripted import Script, context_state, offline_coordinator

NOW = 1_700_000_000_000
LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.5)
GPT4O = WrapOptions(model="gpt-4o", provider="openai", input_tokens_estimate=1000,
                    max_output_tokens=1000)


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


def priced(model: str) -> int:
    usd = price_usd(model, 1000, 1000, provider="openai")
    assert usd is not None
    return usd_to_micro(usd, round_up=True)


def test_a_plain_call_carries_no_terms(coord: Coordinator) -> None:
    state = context_state(coord, degrade=LADDER)
    assert edge_terms(state, WrapOptions(model="gpt-4o-mini"), 1, 0) is PLAIN
    assert edge_terms(context_state(coord), GPT4O, 1, 0) is PLAIN


def test_a_ladder_call_carries_each_rung_at_its_worst_case(coord: Coordinator) -> None:
    state = context_state(coord, degrade=LADDER)
    terms = edge_terms(state, GPT4O, 10, 5)
    assert terms == EdgeTerms(False, ("gpt-4o", priced("gpt-4o"), "gpt-4o-mini",
                                      priced("gpt-4o-mini")), 500_000)
    assert priced("gpt-4o") > priced("gpt-4o-mini") > 0
    # a larger estimate or floor than the price wins
    big = edge_terms(state, GPT4O, 10**9, 10**8)
    assert big.rungs == ("gpt-4o", 10**9, "gpt-4o-mini", 10**8)


def test_an_unpriced_rung_is_held_at_the_floor(coord: Coordinator) -> None:
    assert worst_case("no-such-model-xyz", GPT4O) == 0
    state = context_state(coord, degrade=Degrade(ladder={"gpt-4o": ["no-such-model-xyz"]}))
    assert edge_terms(state, GPT4O, 7, 3).rungs[3] == 3


def test_final_comes_from_the_options_or_a_finishing_block_on_the_path(
        coord: Coordinator) -> None:
    state = context_state(coord, ids=("root", "child"))
    assert edge_terms(state, WrapOptions(final=True), 1, 0).final
    assert not edge_terms(state, WrapOptions(), 1, 0).final
    with finishing("root"):  # an ancestor's block covers its descendants
        assert edge_terms(state, WrapOptions(), 1, 0).final
    with finishing("elsewhere"):
        assert not edge_terms(state, WrapOptions(), 1, 0).final
    assert not edge_terms(state, WrapOptions(), 1, 0).final  # the block is over


def test_the_rung_reserve_chose_is_what_the_call_runs_on(coord: Coordinator) -> None:
    state = context_state(coord, degrade=LADDER)
    script = Script([(Reserve, Held(NOW, [], 2))])
    call = drive(begin(state, object(), "llm", GPT4O), script)
    assert isinstance(call, Call)
    (reserve,) = script.asked
    assert isinstance(reserve, Reserve) and reserve.terms.rungs[0] == "gpt-4o"
    assert call.model == "gpt-4o-mini" and call.degraded_from == "gpt-4o"
    assert call.held["usd"] == priced("gpt-4o-mini")


def test_the_requested_rung_runs_undegraded_at_its_worst_case(coord: Coordinator) -> None:
    state = context_state(coord, degrade=LADDER)
    call = drive(begin(state, object(), "llm", GPT4O), Script([(Reserve, Held(NOW, [], 1))]))
    assert isinstance(call, Call)
    assert call.model == "gpt-4o" and call.degraded_from is None
    assert call.held["usd"] == priced("gpt-4o")


def test_a_final_reserve_refusal_halts_the_call_and_stops_nothing(coord: Coordinator) -> None:
    state = context_state(coord, final_reserve_usd=1.0)
    refused = Refused(0, "final_reserve", "usd needs $0.25", False, NOW)
    script = Script([(Reserve, refused), (Refusal, None)])
    outcome = drive(begin(state, object(), "llm", WrapOptions(cost_estimate_hint=0.25)),
                    script)
    assert outcome == Outcome(Decision.HALT, reason="final_reserve", detail="usd needs $0.25")
    assert state.stopped is None


def test_current_call_is_none_outside_a_wrapped_call() -> None:
    assert current_call() is None


def test_state_config_reaches_edge_terms(coord: Coordinator) -> None:
    state: ContextState = context_state(coord, degrade=LADDER, final_reserve_usd=0.5)
    terms = edge_terms(state, GPT4O.model_copy(update={"final": True}), 1, 0)
    assert terms.final and terms.below_ppm == 500_000
