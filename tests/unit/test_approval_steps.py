"""``begin``'s wait for approval (ExecutionConfig.approval_wait_s), driven with scripted
replies (no Redis): a call refused by a ceiling shows its tree waiting, asks again after
each wake, and goes on when held, or halts as it would have at once when the wait ends,
or with the stop that cancelled its context."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from coordinator import Decision, WrapOptions
from coordinator.context.call import Call, Outcome, begin
from coordinator.context.state import ContextState
from coordinator.context.steps import Request, Steps, adrive, drive
from coordinator.core.paths import Path
from coordinator.core.vocabulary import StopReason
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.replies import Held, Refused, Replayed
from coordinator.store.requests import (
    ApprovalEnd,
    ApprovalStart,
    AwaitApproval,
    Reap,
    Refusal,
    Reserve,
)
from tests.unit.scripted import Script, context_state, offline_coordinator
from tests.unit.test_begin_steps import expired_hold

OPTS = WrapOptions(cost_estimate_hint=0.25)
NOW = 1_700_000_000_000
UNTIL = NOW + 300_000
STOPPED = Refused(0, "budget_exceeded", "cost 10.0 of 10.0", True, NOW)
NO_ROOM = Refused(0, "budget_exceeded", "no room", False, NOW)


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


@pytest.fixture
def state(coord: Coordinator) -> ContextState:
    return context_state(coord, approval_wait_s=300)


def run_begin(state: ContextState, script: Script) -> Call | Outcome:
    result = drive(begin(state, object(), "llm", OPTS), script)
    assert script.done(), f"not asked: {script.expected}"
    return result


def test_a_refused_call_waits_and_goes_on_once_held(state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, STOPPED), (AwaitApproval, True), (Reserve, Held(NOW, [])),
                     (ApprovalEnd, None)])
    call = run_begin(state, script)
    assert isinstance(call, Call) and call.reserved
    start = script.asked[1]
    assert start == ApprovalStart(state.path, "budget_exceeded", 300_000)
    assert script.asked[2] == AwaitApproval(state.path, UNTIL)
    assert script.asked[-1] == ApprovalEnd(state.path, UNTIL)
    reserves = [r for r in script.asked if isinstance(r, Reserve)]
    assert {r.reservation_id for r in reserves} == {call.call_id}  # the same call asks again
    assert state.stopped is None  # held at every level: no ceiling stops the path


def test_a_call_that_does_not_fit_waits_too(state: ContextState) -> None:
    script = Script([(Reserve, NO_ROOM), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, Held(NOW, [])), (ApprovalEnd, None)])
    assert isinstance(run_begin(state, script), Call)


def test_a_stop_heard_here_waits_instead_of_halting_at_once(state: ContextState) -> None:
    state.stopped = "step_limit_exceeded"
    refused = Refused(0, "step_limit_exceeded", "steps 100 of 100", True, NOW)
    script = Script([(Reserve, refused), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, Held(NOW, [])), (ApprovalEnd, None)])
    assert isinstance(run_begin(state, script), Call)
    assert state.stopped is None


def test_at_the_end_of_the_wait_it_asks_once_more_then_halts_as_at_once(
        state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, False),
                     (Reserve, STOPPED), (ApprovalEnd, None), (Refusal, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason="budget_exceeded",
                              detail="cost 10.0 of 10.0")
    assert state.stopped == "budget_exceeded"
    refusal = script.asked[-1]
    assert isinstance(refusal, Refusal) and refusal.reason == "budget_exceeded"
    assert json.loads(refusal.node)["status"] == "halted"


@pytest.mark.parametrize("reason", [StopReason.ABORTED, StopReason.TIMEOUT])
def test_a_cancelled_context_ends_the_wait_with_its_stop(state: ContextState,
                                                         reason: StopReason) -> None:
    def cancelled(_: AwaitApproval) -> bool:
        state.handle_stop(reason)  # the abort heard while it waited
        return True

    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, cancelled),
                     (ApprovalEnd, None), (Refusal, None)])
    outcome = run_begin(state, script)
    assert outcome == Outcome(Decision.HALT, reason=reason, detail=f"stopped: {reason}")
    refusal = script.asked[-1]
    assert isinstance(refusal, Refusal)
    record = json.loads(refusal.node)
    assert (record["status"], record["stop_reason"]) == (reason, reason)


@pytest.mark.parametrize("reason", ["aborted", "timeout", "closed", "state_corrupt"])
def test_stops_no_raise_lifts_halt_at_once(state: ContextState, reason: str) -> None:
    script = Script([(Reserve, Refused(0, reason, reason, True, NOW)), (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == reason


def test_a_refusal_for_another_reason_while_waiting_ends_the_wait(
        state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, Refused(0, "aborted", "stopped: aborted", True, NOW)),
                     (ApprovalEnd, None), (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "aborted"


def test_a_replay_heard_while_waiting_ends_the_wait(state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, Replayed("ok", NOW)), (ApprovalEnd, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.decision == Decision.ALLOW


def test_expired_holds_found_while_waiting_are_reaped(state: ContextState) -> None:
    expired = [expired_hold()]
    refused = Refused(0, "budget_exceeded", "no room", False, NOW, expired)
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL), (AwaitApproval, True),
                     (Reserve, refused), (Reap, None), (AwaitApproval, True),
                     (Reserve, Held(NOW, [])), (ApprovalEnd, None)])
    assert isinstance(run_begin(state, script), Call)


def test_a_gone_tree_halts_without_a_wait(state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, 0), (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "budget_exceeded"


def test_an_error_while_waiting_ends_the_wait_and_is_raised(state: ContextState) -> None:
    script = Script([(Reserve, STOPPED), (ApprovalStart, UNTIL),
                     (AwaitApproval, KeyboardInterrupt()), (ApprovalEnd, None)])
    with pytest.raises(KeyboardInterrupt):
        run_begin(state, script)
    assert script.done()


def test_without_approval_wait_a_ceiling_halts_at_once(coord: Coordinator) -> None:
    state = context_state(coord)
    script = Script([(Reserve, STOPPED), (Refusal, None)])
    outcome = run_begin(state, script)
    assert isinstance(outcome, Outcome) and outcome.reason == "budget_exceeded"


def _one_wait(path: Path) -> Steps[bool]:
    time_left: bool = yield AwaitApproval(path, UNTIL)
    return time_left


def test_the_async_driver_awaits_the_executors_wait_on_the_loop(state: ContextState) -> None:
    awaited: list[AwaitApproval] = []

    class Waits:
        def __call__(self, request: Request) -> bool:
            raise AssertionError("the blocking wait ran on the event loop")

        async def await_approval(self, request: AwaitApproval) -> bool:
            awaited.append(request)
            await asyncio.sleep(0)
            return True

    io = state.coord.io
    assert asyncio.run(adrive(_one_wait(state.path), Waits(), io)) is True
    assert awaited == [AwaitApproval(state.path, UNTIL)]
    # a script without an async wait answers it at once
    script = Script([(AwaitApproval, False)])
    assert asyncio.run(adrive(_one_wait(state.path), script, io)) is False
