"""Model ladders and the final reserve in lease mode, in a call's first steps with
scripted replies (no Redis): the rung a slice serves (the requested model while the
slice was taken above the threshold, the cheapest that fits once below it), a new slice
or a strict reserve when none fits, and a final-reserve refusal that stops neither the
context nor its slice; the ladder's worst cases priced once per price generation."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from coordinator import Degrade, LeasePolicy, WrapOptions, set_price
from coordinator.context.call import Call, Outcome, begin
from coordinator.context.edge import edge_terms
from coordinator.context.lease_registry import slice_of
from coordinator.context.lease_rungs import served_rung
from coordinator.context.state import ContextState
from coordinator.context.steps import drive
from coordinator.core import pricing
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.replies import Held, Refused
from coordinator.store.requests import Refusal, Reserve, TakeSlice
from tests.unit.scripted import Script, context_state, offline_coordinator

NOW = 1_700_000_000_000
LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.5)
LEASE = LeasePolicy(usd=0.05, steps=1000, tokens=100_000, max_age_ms=60_000)
GPT4O = WrapOptions(model="gpt-4o", provider="openai", input_tokens_estimate=1000,
                    max_output_tokens=1000)
FULL, MINI = 12_500, 750  # micro-USD: each model's worst case at 1,000 tokens each way
RUNGS = ("a", 100, "b", 30, "c", 30, "d", 50)


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


@pytest.fixture
def leased(coord: Coordinator) -> Iterator[ContextState]:
    state = context_state(coord, lease=LEASE, degrade=LADDER, final_reserve_usd=1.0)
    yield state
    lease = slice_of(state)
    assert lease is not None
    lease.pid = -1  # as a forked child's: it writes nothing at exit (there is no Redis)


def live_slice(state: ContextState, usd: int, *, low: bool) -> None:
    """The slice as a take that landed leaves it (its reply was scripted)."""
    lease = slice_of(state)
    assert lease is not None
    lease.slice_id, lease.low = "slice:unit", low
    lease.avail = {"usd": usd, "steps": 1000, "tin": 100_000, "tout": 100_000,
                   "openai.tin": 100_000, "openai.tout": 100_000}
    lease.expires = time.monotonic() + 60


def run_begin(state: ContextState, script: Script, opts: WrapOptions = GPT4O
              ) -> Call | Outcome:
    result = drive(begin(state, object(), "llm", opts), script)
    assert script.done(), f"not asked: {script.expected}"
    return result


def test_above_the_threshold_a_slice_serves_the_requested_model_or_none() -> None:
    assert served_rung(RUNGS, 100, low=False) == 1
    assert served_rung(RUNGS, 99, low=False) == 0  # not a cheaper one: strict decides


def test_below_it_the_cheapest_rung_that_fits_the_later_of_equal_ones() -> None:
    assert served_rung(RUNGS, 1000, low=True) == 3
    assert served_rung(RUNGS, 29, low=True) == 0
    assert served_rung(("a", 10, "b", 20), 15, low=True) == 1


def test_a_slice_taken_above_the_threshold_serves_the_requested_model(
        leased: ContextState) -> None:
    live_slice(leased, 50_000, low=False)
    call = run_begin(leased, Script([]))  # no request at all
    assert isinstance(call, Call) and call.lease is slice_of(leased)
    assert call.model == "gpt-4o" and call.degraded_from is None
    assert call.held["usd"] == FULL and call.lease.avail["usd"] == 50_000 - FULL


def test_a_slice_taken_below_it_serves_the_cheaper_rung(leased: ContextState) -> None:
    live_slice(leased, 50_000, low=True)
    call = run_begin(leased, Script([]))
    assert isinstance(call, Call) and call.lease is not None
    assert call.model == "gpt-4o-mini" and call.degraded_from == "gpt-4o"
    assert call.held["usd"] == MINI and call.lease.avail["usd"] == 50_000 - MINI


def test_a_call_no_rung_of_the_slice_fits_takes_a_new_slice_with_its_ladder(
        leased: ContextState) -> None:
    live_slice(leased, FULL - 1, low=False)
    script = Script([(TakeSlice, (2, [], []))])  # the new slice served it on rung 2
    call = run_begin(leased, script)
    take = script.asked[0]
    assert isinstance(take, TakeSlice) and tuple(take.rungs) == ("gpt-4o", FULL,
                                                                "gpt-4o-mini", MINI)
    assert isinstance(call, Call) and call.lease is not None
    assert call.model == "gpt-4o-mini" and call.held["usd"] == MINI


def test_then_a_strict_reserve_chooses_as_reserve_lua_does(leased: ContextState) -> None:
    script = Script([(TakeSlice, (0, [], [])), (Reserve, Held(NOW, [], 2))])
    call = run_begin(leased, script)
    reserve = script.asked[1]
    assert isinstance(reserve, Reserve) and reserve.terms.rungs[0] == "gpt-4o"
    assert isinstance(call, Call) and call.lease is None
    assert call.model == "gpt-4o-mini" and call.degraded_from == "gpt-4o"


def test_a_final_reserve_refusal_in_lease_mode_stops_neither_context_nor_slice(
        leased: ContextState) -> None:
    refused = Refused(0, "final_reserve", "usd needs $0.01", False, NOW)
    script = Script([(TakeSlice, (0, [], [])), (Reserve, refused), (Refusal, None)])
    outcome = run_begin(leased, script, WrapOptions(cost_estimate_hint=0.01))
    assert isinstance(outcome, Outcome) and outcome.reason == "final_reserve"
    lease = slice_of(leased)
    assert leased.stopped is None and lease is not None and lease.stopped is None
    assert not leased.cancellation_token.cancelled


def test_a_final_reserve_refusal_begins_no_approval_wait(coord: Coordinator) -> None:
    state = context_state(coord, lease=LEASE, final_reserve_usd=1.0, approval_wait_s=5.0)
    refused = Refused(0, "final_reserve", "usd needs $0.01", False, NOW)
    script = Script([(TakeSlice, (0, [], [])), (Reserve, refused), (Refusal, None)])
    outcome = run_begin(state, script, WrapOptions(cost_estimate_hint=0.01))
    assert isinstance(outcome, Outcome) and outcome.reason == "final_reserve"
    assert state.stopped is None
    lease = slice_of(state)
    assert lease is not None
    lease.pid = -1


def test_a_final_call_is_served_from_the_slice_when_it_fits(leased: ContextState) -> None:
    live_slice(leased, 50_000, low=False)
    call = run_begin(leased, Script([]), WrapOptions(cost_estimate_hint=0.01, final=True))
    assert isinstance(call, Call) and call.lease is not None and call.final


def test_worst_cases_are_priced_again_after_a_price_changes(coord: Coordinator) -> None:
    state = context_state(coord, degrade=LADDER)
    assert edge_terms(state, GPT4O, 1, 0).rungs[3] == MINI
    try:
        set_price("gpt-4o-mini", input_per_mtok=1.0, output_per_mtok=1.0)
        assert edge_terms(state, GPT4O, 1, 0).rungs[3] == 2000
    finally:
        pricing.clear_prices()
    assert edge_terms(state, GPT4O, 1, 0).rungs[3] == MINI
