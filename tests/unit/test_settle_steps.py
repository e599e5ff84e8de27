"""``complete`` and ``fail``, the call's steps after it ran, driven with scripted store
replies (no Redis): what each ending is charged, counted and recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from coordinator import Decision, WrapOptions
from coordinator.context.call import Call, begin
from coordinator.context.cancellation import CancelledByContext
from coordinator.context.hooks import AfterRaise, AfterReturn, BeforeCall, ReleaseProbe
from coordinator.context.settling import complete, fail
from coordinator.context.state import ContextState
from coordinator.context.steps import drive
from coordinator.core.usage import Usage
from coordinator.errors import DeadlineExceededError
from coordinator.runtime.coordinator import Coordinator
from coordinator.shield.pipeline import ShieldPipeline
from coordinator.store.replies import Held, Stop
from coordinator.store.requests import ChainEvent, Event, Finish, Reserve
from tests.unit.scripted import Script, context_state, offline_coordinator

NOW = 1_700_000_000_000
SETTLED: list[Stop] = []


@pytest.fixture
def coord() -> Iterator[Coordinator]:
    c = offline_coordinator()
    yield c
    c.close()


@pytest.fixture
def state(coord: Coordinator) -> ContextState:
    return context_state(coord)


def started(state: ContextState, opts: WrapOptions | None = None) -> Call:
    call = drive(begin(state, object(), "llm", opts or WrapOptions(cost_estimate_hint=0.25)),
                 Script([(Reserve, Held(NOW, []))]))
    assert isinstance(call, Call)
    return call


def finish_of(script: Script) -> Finish:
    (finish,) = [r for r in script.asked if isinstance(r, Finish)]
    return finish


def test_a_call_that_returned_is_settled_behind_at_its_estimate(state: ContextState) -> None:
    call = started(state)
    script = Script([(Finish, [])])
    outcome = drive(complete(call, "the answer"), script)
    assert (outcome.decision, outcome.result) == (Decision.ALLOW, "the answer")
    finish = finish_of(script)
    assert (finish.outcome, finish.write_behind) == ("ok", True)
    assert list(finish.amounts) == ["usd", 250_000]
    assert finish.node is not None
    assert (finish.node["status"], finish.node["steps_used"], finish.node["charged_by"]) \
        == ("ok", 1, "estimate")
    assert call.settled is finish.node


def test_reported_usage_above_the_estimate_is_settled_now(state: ContextState) -> None:
    call = started(state)
    call.collector.add(Usage(cost_usd=1.5))
    script = Script([(Finish, SETTLED)])
    drive(complete(call, None), script)
    finish = finish_of(script)
    assert not finish.write_behind and list(finish.amounts) == ["usd", 1_500_000]


def test_a_settle_that_stops_a_level_stops_this_context(state: ContextState) -> None:
    call = started(state)
    call.collector.add(Usage(cost_usd=1.5))
    stop = Stop("root", "budget_exceeded", "cost 10.5 of 10.0")
    drive(complete(call, None), Script([(Finish, [stop])]))
    assert state.stopped == "budget_exceeded"


def test_hooks_after_a_return_decide_and_learn_the_cost(coord: Coordinator) -> None:
    state = context_state(coord)
    state.pipeline = ShieldPipeline()
    call = drive(begin(state, object(), "llm", WrapOptions(cost_estimate_hint=0.25)),
                 Script([(Reserve, Held(NOW, [])), (BeforeCall, None)]))
    assert isinstance(call, Call)
    script = Script([(AfterReturn, Decision.HALT), (Finish, SETTLED)])
    outcome = drive(complete(call, 1), script)
    assert outcome.decision == Decision.HALT
    after = script.asked[0]
    assert isinstance(after, AfterReturn) and after.cost == 250_000


def test_a_retryable_failure_is_released_counting_a_retry(state: ContextState) -> None:
    call = started(state)
    error = RuntimeError("provider said 503")
    script = Script([(Finish, SETTLED), (Event, None)])
    outcome = drive(fail(call, error), script)
    assert outcome is not None and outcome.decision == Decision.RETRY
    finish, event = script.asked
    assert isinstance(finish, Finish) and finish.outcome == "error"
    assert finish.node is not None and finish.node["retries_used"] == 1
    assert finish.node["error_type"] == "RuntimeError"
    assert isinstance(event, Event) and event.once == "call_failed:RuntimeError"


def test_a_failure_that_spent_the_retry_budget_halts(state: ContextState) -> None:
    call = started(state)
    stop = Stop("root", "retry_budget_exceeded", "retries 3 of 3")
    script = Script([(Finish, [stop]), (Event, None), (Event, None)])
    outcome = drive(fail(call, RuntimeError("503")), script)
    assert outcome is not None
    assert (outcome.decision, outcome.reason) == (Decision.HALT, "provider_error")
    last = script.asked[-1]
    assert isinstance(last, Event) and json.loads(last.event)["event_type"] == "provider_error"


def test_an_error_that_is_not_retryable_counts_a_step_and_is_raised(
        state: ContextState) -> None:
    call = started(state, WrapOptions(cost_estimate_hint=0.25, retry_on=(ValueError,)))
    script = Script([(Finish, SETTLED), (Event, None)])
    assert drive(fail(call, RuntimeError("bug")), script) is None
    finish = finish_of(script)
    assert finish.outcome == "ok" and finish.node is not None
    assert (finish.node["status"], finish.node["steps_used"]) == ("error", 1)


def test_a_tool_giving_up_on_its_deadline_halts_with_timeout(state: ContextState) -> None:
    call = started(state)
    script = Script([(Finish, SETTLED), (Event, None)])
    outcome = drive(fail(call, DeadlineExceededError("no time left")), script)
    assert outcome is not None
    assert (outcome.decision, outcome.reason) == (Decision.HALT, "timeout")
    assert finish_of(script).node["status"] == "timeout"  # type: ignore[index]


@pytest.mark.parametrize("reason", ["aborted", "timeout"])
def test_a_cancelled_call_is_charged_and_counts_a_step(state: ContextState,
                                                       reason: str) -> None:
    state.cancellation_token.cancel(reason)
    call = started(state)
    script = Script([(Finish, SETTLED)])
    outcome = drive(fail(call, CancelledByContext(reason)), script)
    assert outcome is not None and (outcome.decision, outcome.reason) == (Decision.HALT,
                                                                          reason)
    finish = finish_of(script)
    assert finish.outcome == "ok" and finish.node is not None
    assert (finish.node["status"], finish.node["cost_usd"]) == (reason, 0.25)


def test_an_interpreter_exit_is_settled_behind_and_raised(state: ContextState) -> None:
    call = started(state)
    script = Script([(Finish, [])])
    assert drive(fail(call, KeyboardInterrupt()), script) is None
    assert finish_of(script).write_behind


def test_the_breaker_hears_failures_and_frees_probes(coord: Coordinator) -> None:
    state = context_state(coord)
    state.circuit_breaker = object()  # never called: the executor would call it
    call = drive(begin(state, object(), "llm", WrapOptions(cost_estimate_hint=0.25)),
                 Script([(Reserve, Held(NOW, [])), (BeforeCall, None)]))
    assert isinstance(call, Call)
    script = Script([(AfterRaise, Decision.RETRY), (Finish, SETTLED), (Event, None)])
    drive(fail(call, RuntimeError("503")), script)
    call2 = drive(begin(state, object(), "llm", WrapOptions(retry_on=(ValueError,))),
                  Script([(Reserve, Held(NOW, [])), (BeforeCall, None)]))
    assert isinstance(call2, Call)
    script2 = Script([(ReleaseProbe, None), (Finish, SETTLED), (Event, None)])
    assert drive(fail(call2, RuntimeError("not the provider's")), script2) is None


def test_a_tool_call_records_its_capability_call_on_the_chain(state: ContextState) -> None:
    call = drive(begin(state, object(), "tool", WrapOptions(operation_name="search")),
                 Script([(Reserve, Held(NOW, []))]))
    assert isinstance(call, Call)
    script = Script([(ChainEvent, None), (Finish, [])])
    drive(complete(call, {"hits": 3}), script)
    chain = script.asked[0]
    assert isinstance(chain, ChainEvent) and chain.root == "root"
    event = json.loads(chain.event)
    assert event["event_type"] == "CapabilityCall"
    assert event["metadata"]["operation"] == "search"
    assert event["metadata"]["result_size"] == len(b'{"hits":3}')
