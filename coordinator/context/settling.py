"""After a call's function ran: what it is charged (core/charging_rules.py) and what it
counts, exactly one of: a retry when it raised a retryable error, else a step (it
returned, raised an error that is not retryable or a tool's limit error, or was
cancelled), and how the wrap ends. Generators of plain requests (store/requests.py,
hooks.py), like call.py's ``begin``; the wrap loops (wrap.py) drive them."""

from __future__ import annotations

from typing import Any

from ..core.amounts import actual_amounts, micro_to_usd, usd_to_micro
from ..core.charging_rules import Charge, Ended, charge
from ..core.usage import Usage, usage_from_response
from ..core.vocabulary import FinishOutcome, NodeStatus, StopReason
from ..errors import (
    DeadlineExceededError,
    InvalidCostError,
    InvalidUsageError,
    TokenBudgetExceededError,
)
from ..models import Decision
from ..store.requests import Event
from .call import Call, Outcome, finish, node, record_capability
from .cancellation import CancelledByContext
from .failures import CallerBug, note_failure, note_once, retryable
from .hooks import AfterRaise, AfterReturn, ReleaseProbe
from .state import ContextState
from .steps import Steps

# Errors raised by tool code that mean "a limit stops me" (the Limits specification).
_LIMIT_ERRORS: dict[type[Exception], str] = {
    DeadlineExceededError: StopReason.TIMEOUT,
    TokenBudgetExceededError: StopReason.TOKEN_BUDGET_EXCEEDED,
}
_INVALID = (InvalidCostError, InvalidUsageError)


def charged(call: Call, usage: Usage | None, ended: Ended, invalid: str | None
            ) -> Steps[Charge]:
    """The call's charge by the rule; records ``usage_unpriced`` (once per context and
    model) and ``invalid_usage`` (once per context and error type)."""
    state, opts = call.state, call.options
    estimate = usd_to_micro(opts.cost_estimate_hint, round_up=True)
    if call.degraded_from is not None:  # the hint priced the model asked for, not the one
        estimate = min(estimate, call.held.get("usd", 0))  # that ran: its worst case is held
    ch = charge(call.held, estimate, usage,
                kind=call.kind, ended=ended, invalid=invalid is not None, model=call.model,
                provider=opts.provider, policy=state.coord.charging)
    if ch.unpriced_model is not None:
        yield note_once(state, "usage_unpriced", ch.unpriced_model,
                  f"model {ch.unpriced_model!r} has no price: charged "
                  f"${micro_to_usd(ch.cost):.6f} by the {ch.rule} rule", Decision.ALLOW,
                  node_id=call.call_id, model=ch.unpriced_model)
    if invalid is not None:
        kind = invalid.partition(":")[0]
        cost = micro_to_usd(ch.cost)
        yield note_once(state, "invalid_usage", kind,
                        f"{invalid}; charged ${cost:.6f} by the {ch.rule} rule",
                        Decision.HALT, node_id=call.call_id)
    return ch


def complete(call: Call, result: Any) -> Steps[Outcome]:
    """Settle a call that returned (one step): what it reported (or its response
    carries) is charged, and written behind when it fits in what was held."""
    state = call.state
    if call.kind == "tool":
        yield from record_capability(call, result=result)
    invalid = call.collector.invalid
    usage = call.collector.usage
    unreadable: Exception | None = None
    if usage is None and invalid is None:
        try:
            usage = usage_from_response(result)
        except Exception as exc:  # noqa: BLE001 - the response's usage cannot be taken
            unreadable = exc
            invalid = f"{type(exc).__name__}: {exc}"
    ch = yield from charged(call, usage, "returned", invalid)
    decision = Decision.ALLOW
    hook_error: BaseException | None = None
    if unreadable is None and (state.pipeline is not None or state.circuit_breaker is not None):
        try:
            decision = yield AfterReturn(call.kind, call.tool_ctx, ch.cost)
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the money is spent whatever a hook does
            hook_error = exc
    if call.reserved:
        amounts = actual_amounts(ch.cost, ch.tin, ch.tout, ch.provider)
        within = all(int(amounts[i + 1]) <= call.held.get(str(amounts[i]), 0)
                     for i in range(0, len(amounts), 2))
        record = node(call, NodeStatus.OK if unreadable is None else NodeStatus.ERROR,
                      charge=ch, steps=1,
                      usage=usage, error=unreadable)
        yield from finish(call, FinishOutcome.OK, record, amounts, write_behind=within)
    if unreadable is not None:
        raise InvalidUsageError(f"call {call.call_id} ran, but its usage cannot be "
                                f"charged ({unreadable}); it was charged "
                                f"${micro_to_usd(ch.cost):.6f} ({ch.rule})") from unreadable
    if hook_error is not None:
        raise hook_error
    return Outcome(decision, result)


def caller_bug(call: Call, bug: CallerBug) -> Steps[None]:
    """Settle a call whose function could not run as given (the wrap raises
    ``bug.error``): one that ran is settled as a return, one that did not is released,
    charged nothing and counted nothing."""
    state = call.state
    if bug.ran:
        yield from complete(call, bug.result)
        return
    if state.circuit_breaker is not None:
        yield ReleaseProbe()
    yield from finish(call, FinishOutcome.SKIP, node(call, NodeStatus.ERROR, error=bug.error), [],
                      write_behind=True)


def fail(call: Call, exc: BaseException) -> Steps[Outcome | None]:
    """Settle a call that raised. Returns the outcome, or None to re-raise (interpreter
    exits, outer cancellations, invalid usage reports, errors that are not retryable)."""
    state = call.state
    if call.kind == "tool":
        yield from record_capability(call, error=exc)
    usage = call.collector.usage
    is_exception = isinstance(exc, Exception)
    retry = is_exception and retryable(exc, call.options)
    if state.circuit_breaker is not None and (
        isinstance(exc, (CancelledByContext, *_LIMIT_ERRORS, *_INVALID)) or not retry
    ):
        # not a provider failure: free a probe it held
        yield ReleaseProbe()
    if isinstance(exc, CancelledByContext):
        return (yield from _cancelled(call, exc, usage))
    invalid = call.collector.invalid
    if invalid is None and isinstance(exc, _INVALID):
        invalid = f"{type(exc).__name__}: {exc}"
    ch = yield from charged(call, usage, "raised", invalid)
    amounts = actual_amounts(ch.cost, ch.tin, ch.tout, ch.provider)
    if not is_exception:
        # Interpreter exits and outer cancellations propagate, never retried: the run
        # counts a step, and what it reported is still charged.
        record = node(call, NodeStatus.ERROR, charge=ch, steps=1, usage=usage, error=exc)
        yield from finish(call, FinishOutcome.OK, record, amounts, write_behind=True)
        return None
    limit_error = next((r for t, r in _LIMIT_ERRORS.items() if isinstance(exc, t)), None)
    if limit_error is not None:
        # A tool gave up on a limit (Limits specification): a step, no retry.
        record = node(call, NodeStatus.TIMEOUT if limit_error == StopReason.TIMEOUT
                      else NodeStatus.HALTED,
                      charge=ch, steps=1, usage=usage, error=exc)
        yield from finish(call, FinishOutcome.OK, record, amounts, write_behind=False)
        yield _event(state, limit_error, f"{type(exc).__name__}: {exc}",
                     node_id=call.call_id, scope="tool")
        return Outcome(Decision.HALT, reason=limit_error, detail=str(exc), error=exc)
    if not retry:  # raised at once: its run counts as a step
        record = node(call, NodeStatus.ERROR, charge=ch, steps=1, usage=usage, error=exc)
        yield from finish(call, FinishOutcome.OK, record, amounts, write_behind=False)
        yield note_failure(state, call.call_id, exc, Decision.HALT)
        return None
    decision = Decision.RETRY
    if not isinstance(exc, _INVALID) and (state.pipeline is not None
                                          or state.circuit_breaker is not None):
        decision = yield AfterRaise(call.tool_ctx, exc)
    record = node(call, NodeStatus.ERROR, charge=ch, retries=1, usage=usage, error=exc)
    stops = yield from finish(call, FinishOutcome.ERROR, record, amounts, write_behind=False)
    yield note_failure(state, call.call_id, exc, decision)
    if isinstance(exc, _INVALID):
        return None  # a bad report is raised, as before, once its retry is counted
    if any(s.reason == StopReason.RETRY_BUDGET_EXCEEDED for s in stops) or (
        state.stopped == StopReason.RETRY_BUDGET_EXCEEDED
    ):
        yield _event(state, "provider_error",
                     f"{type(exc).__name__}: {exc} (retry budget exhausted)",
                     node_id=call.call_id)
        return Outcome(Decision.HALT, reason="provider_error", detail=str(exc), error=exc)
    return Outcome(decision, reason=None if decision == Decision.RETRY else "pipeline",
                   error=exc)


def _cancelled(call: Call, exc: CancelledByContext, usage: Usage | None) -> Steps[Outcome]:
    """Work was in flight when it was cancelled: charge what it reported, else its
    estimate (it may have been billed); its run counts a step (it is not retried)."""
    state = call.state
    reason = (StopReason(exc.reason) if exc.reason in (StopReason.ABORTED, StopReason.TIMEOUT)
              else StopReason.ABORTED)
    ch = yield from charged(call, usage, "cancelled", None)
    record = node(call, NodeStatus(reason), charge=ch, steps=1, usage=usage, error=exc)
    amounts = actual_amounts(ch.cost, ch.tin, ch.tout, ch.provider)
    yield from finish(call, FinishOutcome.OK, record, amounts, write_behind=False)
    if not state.cancellation_token.cancelled:  # the call's own timeout
        yield _event(state, StopReason.TIMEOUT, f"call exceeded {call.options.timeout_ms} ms",
                     node_id=call.call_id, scope="call")
    return Outcome(Decision.HALT, reason=reason, error=exc)


def _event(state: ContextState, event_type: str, reason: str, **metadata: Any) -> Event:
    """The request appending a HALT event of the core to the context's log."""
    return Event(state.path, state.event(event_type, reason, **metadata).model_dump_json())
