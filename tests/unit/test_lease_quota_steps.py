"""The lease and quota parts of a call's steps, driven with scripted store replies (no
Redis): a slice taken like a reserve, calls served from it with no request at all, its
batch written when it must be; a quota grant topped up, or the quota's refusal."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from coordinator import Decision, LeasePolicy, WrapOptions
from coordinator.context.call import Call, Outcome, begin
from coordinator.context.lease_registry import slice_of
from coordinator.context.settling import complete
from coordinator.context.state import ContextState
from coordinator.context.steps import drive
from coordinator.core.usage import Usage
from coordinator.quotas.keeper import MAX_STEPS, Refill
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.records import ReservationRecord
from coordinator.store.replies import Held, Refused, Stop
from coordinator.store.requests import Reap, Refusal, Reserve, TakeSlice, TopUp, WriteSlice
from tests.unit.scripted import Script, context_state, offline_coordinator

NOW = 1_700_000_000_000
OPTS = WrapOptions(cost_estimate_hint=0.01)
LEASE = LeasePolicy(usd=0.05, steps=1000, max_age_ms=60_000)


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


def run_begin(state: ContextState, script: Script) -> Call | Outcome:
    result = drive(begin(state, object(), "llm", OPTS), script)
    assert script.done(), f"not asked: {script.expected}"
    return result


# -- lease mode ------------------------------------------------------------------------

@pytest.fixture
def leased(coord: Coordinator) -> Iterator[ContextState]:
    state = context_state(coord, lease=LEASE)
    yield state
    lease = slice_of(state)
    assert lease is not None
    lease.pid = -1  # as a forked child's: it writes nothing at exit (there is no Redis)


def live_slice(state: ContextState) -> None:
    """The slice as a take that landed leaves it (the take's reply was scripted)."""
    lease = slice_of(state)
    assert lease is not None
    lease.slice_id, lease.avail = "slice:unit", {"usd": 50_000, "steps": 1000}
    lease.expires = time.monotonic() + 60


def test_the_first_call_takes_a_slice_instead_of_a_reserve(leased: ContextState) -> None:
    script = Script([(TakeSlice, (True, [], []))])
    call = run_begin(leased, script)
    assert isinstance(call, Call) and call.lease is slice_of(leased)
    take = script.asked[0]
    assert isinstance(take, TakeSlice) and list(take.amounts) == ["usd", 10_000, "steps", 1]
    assert take.owner == call.lease.owner


def test_a_slice_refused_near_a_ceiling_falls_back_to_a_strict_reserve(
        leased: ContextState) -> None:
    script = Script([(TakeSlice, (False, [], [])), (Reserve, Held(NOW, []))])
    call = run_begin(leased, script)
    assert isinstance(call, Call) and call.lease is None


def test_a_take_reaps_the_expired_holds_it_found(leased: ContextState) -> None:
    dead = [("slice:dead", ReservationRecord("root", ("root",), ("usd", 5), False))]
    script = Script([(TakeSlice, (True, dead, [])), (Reap, None)])
    assert isinstance(run_begin(leased, script), Call)
    assert script.asked[1] == Reap(leased.path, dead)


def test_a_stop_heard_by_a_take_is_applied_and_the_reserve_refused(
        leased: ContextState) -> None:
    stop = Stop("root", "aborted", "by an operator")
    script = Script([(TakeSlice, (False, [], [stop])),
                     (Reserve, Refused(0, "aborted", "aborted", True, NOW)), (Refusal, None)])
    outcome = run_begin(leased, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "aborted"
    assert leased.stopped == "aborted" and leased.cancellation_token.cancelled


def test_a_stalled_take_fails_closed_with_nothing_to_withdraw(leased: ContextState) -> None:
    script = Script([(TakeSlice, redis.ConnectionError("stalled"))])
    outcome = run_begin(leased, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "backend_unavailable"


def test_a_call_the_live_slice_covers_makes_no_request_at_all(leased: ContextState) -> None:
    live_slice(leased)
    for _ in range(5):
        call = run_begin(leased, Script([]))
        assert isinstance(call, Call) and call.lease is not None
        outcome = drive(complete(call, None), Script([]))  # counted in the batch
        assert outcome.decision == Decision.ALLOW
    lease = slice_of(leased)
    assert lease is not None and len(lease._records) == 5
    assert lease._spent == {"usd": 50_000, "steps": 5}


def test_a_served_call_that_overspent_its_promise_writes_the_batch_now(
        leased: ContextState) -> None:
    live_slice(leased)
    call = run_begin(leased, Script([]))
    assert isinstance(call, Call)
    call.collector.add(Usage(cost_usd=0.02))
    script = Script([(WriteSlice, [])])
    drive(complete(call, None), script)
    assert script.asked == [WriteSlice(call.lease.owner, False)]  # type: ignore[union-attr]


def test_the_last_served_call_after_a_stop_gives_the_slice_back(
        leased: ContextState) -> None:
    live_slice(leased)
    call = run_begin(leased, Script([]))
    assert isinstance(call, Call) and call.lease is not None
    call.lease.stopped = "budget_exceeded"
    stop = Stop("root", "budget_exceeded", "cost 10 of 10")
    script = Script([(WriteSlice, [stop])])
    drive(complete(call, None), script)
    assert script.asked == [WriteSlice(call.lease.owner, True)]
    assert leased.stopped == "budget_exceeded"


# -- quotas -----------------------------------------------------------------------------

def grant_short(now: int = NOW) -> Refused:
    return Refused(0, "quota_grant", "0 short", False, now)


def test_a_short_quota_grant_is_topped_up_and_the_reserve_asked_again(
        coord: Coordinator) -> None:
    state = context_state(coord)
    script = Script([(Reserve, grant_short()), (TopUp, Refill(True)),
                     (Reserve, Held(NOW, []))])
    assert isinstance(run_begin(state, script), Call)
    top_up = script.asked[1]
    assert top_up == TopUp(state.path, "0 short", {"usd": 10_000, "calls": 1, "tok": 0})


def test_a_quota_refusal_refuses_the_call_and_stops_nothing(coord: Coordinator) -> None:
    state = context_state(coord)
    detail = "quota 'daily' (2026-11-28): usd 5.0 of 5.0"
    script = Script([(Reserve, grant_short()),
                     (TopUp, Refill(False, "quota_exceeded", detail)), (Refusal, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason="quota_exceeded", detail=detail)
    assert state.stopped is None


def test_a_grant_taken_elsewhere_every_time_ends_in_a_refusal(coord: Coordinator) -> None:
    state = context_state(coord)
    rounds = [(TopUp, Refill(True)), (Reserve, grant_short())] * (2 * MAX_STEPS)
    script = Script([(Reserve, grant_short()), *rounds, (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "quota_exceeded"
    assert "could not be topped up" in outcome.detail
