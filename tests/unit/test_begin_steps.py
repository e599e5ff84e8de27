"""``begin``, the call's steps before it runs, driven with scripted store replies (no
Redis): every way a call is let through or stopped before its function runs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from coordinator import Decision, WrapOptions
from coordinator.context.call import Call, Outcome, begin
from coordinator.context.hooks import BeforeCall, HookRefusal
from coordinator.context.state import ContextState, PendingOpen
from coordinator.context.steps import drive
from coordinator.core.charging_rules import ChargingPolicy
from coordinator.runtime.coordinator import Coordinator
from coordinator.shield.pipeline import ShieldPipeline
from coordinator.store.records import ReservationRecord
from coordinator.store.replies import Held, Refused, Replayed
from coordinator.store.requests import Finish, Flush, Open, Reap, Refusal, Reserve
from tests.unit.scripted import Script, context_state, offline_coordinator

OPTS = WrapOptions(cost_estimate_hint=0.25, operation_name="summarise")
NOW = 1_700_000_000_000


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


@pytest.fixture
def state(coord: Coordinator) -> ContextState:
    return context_state(coord)


def run_begin(state: ContextState, script: Script, opts: WrapOptions = OPTS
              ) -> Call | Outcome:
    result = drive(begin(state, object(), "llm", opts), script)
    assert script.done(), f"not asked: {script.expected}"
    return result


def refusal_record(request: Refusal) -> dict[str, object]:
    return dict(json.loads(request.node))


def test_an_allowed_call_reserves_its_estimate_in_one_request(state: ContextState) -> None:
    script = Script([(Reserve, Held(NOW, []))])
    call = run_begin(state, script)
    assert isinstance(call, Call) and call.reserved and call.lease is None
    (reserve,) = script.asked
    assert isinstance(reserve, Reserve)
    assert reserve.path == state.path and reserve.reservation_id == call.call_id
    assert list(reserve.amounts) == ["usd", 250_000, "steps", 1]
    assert not reserve.keyed and reserve.resend
    assert call.held == {"usd": 250_000, "steps": 1}


def test_a_context_not_yet_open_is_opened_before_the_reserve(state: ContextState) -> None:
    state.pending_open = PendingOpen(plan=None, meta_json="{}")  # type: ignore[arg-type]
    script = Script([(Open, None), (Reserve, Held(NOW, []))])
    assert isinstance(run_begin(state, script), Call)
    assert script.asked[0] == Open(state.ctx_id)


@pytest.mark.parametrize(("reason", "status"), [("budget_exceeded", "halted"),
                                                ("aborted", "aborted"), ("timeout", "timeout")])
def test_a_stop_heard_here_refuses_without_a_reserve(state: ContextState, reason: str,
                                                    status: str) -> None:
    state.stopped = reason
    script = Script([(Refusal, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason=reason, detail=f"stopped: {reason}")
    (refusal,) = script.asked
    assert isinstance(refusal, Refusal) and refusal.reason == reason
    record = refusal_record(refusal)
    assert record["status"] == status and record["stop_reason"] == reason
    assert record["stop_detail"] == f"stopped: {reason}"
    assert json.loads(refusal.event)["event_type"] == reason


def test_a_closed_context_refuses(state: ContextState) -> None:
    state.closed = True
    script = Script([(Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "closed"


def test_strict_pricing_refuses_an_unpriced_model_before_the_reserve() -> None:
    coord = offline_coordinator(charging=ChargingPolicy(pricing="strict"))
    state = context_state(coord)
    script = Script([(Refusal, None)])
    outcome = run_begin(state, script, WrapOptions(model="no-such-model-anywhere"))
    assert isinstance(outcome, Outcome) and outcome.reason == "unpriced_model"
    coord.close()


def test_a_level_that_stopped_refuses_and_stops_this_context(coord: Coordinator) -> None:
    state = context_state(coord, ("root", "child"))
    detail = "cost 10.0 of 10.0"
    script = Script([(Reserve, Refused(0, "budget_exceeded", detail, True, NOW)),
                     (Refusal, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason="budget_exceeded", detail=detail)
    assert state.stopped == "budget_exceeded"
    refusal = script.asked[1]
    assert isinstance(refusal, Refusal)
    assert json.loads(refusal.event)["metadata"]["stopped_at"] == "root"


def test_a_call_that_does_not_fit_is_refused_without_a_stop(state: ContextState) -> None:
    script = Script([(Reserve, Refused(0, "budget_exceeded", "no room", False, NOW)),
                     (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "budget_exceeded"
    assert state.stopped is None


def expired_hold() -> tuple[str, ReservationRecord]:
    return ("dead-call", ReservationRecord("root", ("root",), ("usd", 5, "steps", 1), False))


def test_expired_holds_that_left_no_room_are_reaped_and_the_reserve_asked_again(
        state: ContextState) -> None:
    expired = [expired_hold()]
    script = Script([(Reserve, Refused(0, "budget_exceeded", "no room", False, NOW, expired)),
                     (Reap, None), (Flush, None), (Reserve, Held(NOW, []))])
    assert isinstance(run_begin(state, script), Call)
    assert script.asked[1] == Reap(state.path, expired)


def test_expired_holds_found_by_a_reserve_that_held_are_reaped(state: ContextState) -> None:
    expired = [expired_hold()]
    script = Script([(Reserve, Held(NOW, expired)), (Reap, None)])
    assert isinstance(run_begin(state, script), Call)


@pytest.mark.parametrize(("outcome", "decision"), [
    ("ok", Decision.ALLOW), ("error", Decision.RETRY), ("skip", Decision.HALT),
    ("halted", Decision.HALT)])
def test_a_replayed_call_ends_as_its_first_delivery_did(state: ContextState, outcome: str,
                                                       decision: Decision) -> None:
    state.call_seq = iter(range(7, 100))  # type: ignore[assignment]
    script = Script([(Reserve, Replayed(outcome, NOW))])
    result = run_begin(state, script)
    assert isinstance(result, Outcome)
    assert (result.decision, result.reason) == (decision, "replayed")
    reserve = script.asked[0]
    assert isinstance(reserve, Reserve) and reserve.keyed
    assert reserve.reservation_id == "root:7"


def test_a_stalled_reserve_halts_offline_and_withdraws_what_may_have_landed(
        state: ContextState) -> None:
    script = Script([(Reserve, redis.ConnectionError("stalled")), (Finish, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "backend_unavailable"
    withdraw = script.asked[1]
    assert isinstance(withdraw, Finish) and withdraw.outcome == "skip"
    assert withdraw.write_behind and withdraw.node is None
    assert withdraw.reservation_id == script.asked[0].reservation_id  # type: ignore[union-attr]
    assert [e.event_type for e in state.offline_events] == ["backend_unavailable"]


def test_a_keyed_call_that_stalled_is_left_to_its_lease(state: ContextState) -> None:
    state.call_seq = iter(range(100))  # type: ignore[assignment]
    script = Script([(Reserve, redis.ConnectionError("stalled"))])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "backend_unavailable"


def test_while_the_breaker_is_open_a_call_fails_closed_with_no_request_at_all(
        state: ContextState) -> None:
    run_begin(state, Script([(Reserve, redis.ConnectionError("down")), (Finish, None)]))
    outcomes = [run_begin(state, Script([])) for _ in range(3)]
    assert all(isinstance(o, Outcome) and o.reason == "backend_unavailable"
               for o in outcomes)
    assert len(state.offline_events) == 1  # one event per run of refusals


def test_fail_open_runs_a_stalled_call_without_a_budget() -> None:
    coord = offline_coordinator(fail_open=True)
    state = context_state(coord)
    script = Script([(Reserve, redis.TimeoutError("slow")), (Finish, None)])
    call = run_begin(state, script)
    assert isinstance(call, Call) and not call.reserved
    coord.close()


def test_a_pipeline_hook_that_refuses_gives_the_hold_back(coord: Coordinator) -> None:
    state = context_state(coord)
    state.pipeline = ShieldPipeline()
    refusal = HookRefusal(Decision.HALT, "pipeline", "a pipeline hook returned HALT")
    script = Script([(Reserve, Held(NOW, [])), (BeforeCall, refusal), (Finish, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason="pipeline",
                              detail="a pipeline hook returned HALT")
    ask, release = script.asked[1], script.asked[2]
    assert isinstance(ask, BeforeCall) and ask.tool_ctx is not None
    assert ask.tool_ctx.operation_name == "summarise"
    assert isinstance(release, Finish) and release.outcome == "skip"
    assert release.node is not None
    assert (release.node["status"], release.node["stop_reason"]) == ("halted", "pipeline")


def test_a_pipeline_hook_that_raises_gives_the_hold_back_and_raises(
        coord: Coordinator) -> None:
    state = context_state(coord)
    state.pipeline = ShieldPipeline()
    script = Script([(Reserve, Held(NOW, [])), (BeforeCall, KeyError("hook")),
                     (Finish, None)])
    with pytest.raises(KeyError):
        run_begin(state, script)
    release = script.asked[2]
    assert isinstance(release, Finish) and release.node is not None
    assert release.node["status"] == "error"


def test_a_pipeline_that_lets_the_call_through(coord: Coordinator) -> None:
    state = context_state(coord)
    state.pipeline = ShieldPipeline()
    script = Script([(Reserve, Held(NOW, [])), (BeforeCall, None)])
    assert isinstance(run_begin(state, script), Call)
