"""One call's reserve -> run -> settle: reserve its estimate at every level and consult the
pipeline and the circuit breaker (``begin``), then settle what it spent (``complete``) or
release its hold (``fail``), and say how it ended. The sync and async loops that run the
call between these steps are in wrap.py.

The steps are generators yielding what they need from the store (steps.py drives them in
the caller's thread or from an event loop): one implementation for both. While the backend
breaker is open (Redis stalled), a call fails closed before anything is sent, unless a
live lease slice covers it (lease_steps.py: such a call yields no request at all)."""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from ..core import pricing
from ..core.amounts import actual_amounts, micro_to_usd, reserve_amounts, usd_to_micro
from ..core.usage import Usage, UsageCollector, usage_from_response
from ..data.chain import capability_called
from ..errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidCostError,
    InvalidUsageError,
    TokenBudgetExceededError,
)
from ..models import Decision, WrapOptions
from ..shield.pipeline import ToolCallContext
from ..shield.policy import PolicyContext
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown, is_stall
from ..store.requests import Blocking, Reserve
from ..store.tree import Held, Replayed, Stop
from .cancellation import CancellationToken, CancelledByContext
from .lease import LeaseSlice
from .lease_registry import slice_of
from .lease_steps import finish_served, release_promise, take_slice
from .reaping import reap
from .state import ContextState
from .steps import Steps

log = logging.getLogger("coordinator")

Kind = Literal["llm", "tool"]
# Errors raised by tool code that mean "a limit stops me" (the Limits specification).
_LIMIT_ERRORS: dict[type[Exception], str] = {
    DeadlineExceededError: "timeout",
    TokenBudgetExceededError: "token_budget_exceeded",
}
_REPLAYED = {"ok": Decision.ALLOW, "error": Decision.RETRY, "skip": Decision.HALT}
MAX_OFFLINE_EVENTS = 1000
"""The events kept of calls refused while Redis was away (the latest; older are dropped)."""


@dataclass(frozen=True)
class Outcome:
    """How one wrap ended: the decision, the function's result, and why it stopped."""

    decision: Decision
    result: Any = None
    reason: str | None = None
    detail: str = ""
    error: BaseException | None = None


@dataclass
class Call:
    """One wrapped call in flight. Its id is also its reservation id."""

    state: ContextState
    owner: object
    """The handle the call was made through (what ``current_context()`` returns)."""
    call_id: str
    kind: Kind
    options: WrapOptions
    amounts: list[str | int]
    tool_ctx: ToolCallContext | None
    token: CancellationToken
    start_ts: float = field(default_factory=time.time)
    collector: UsageCollector = field(default_factory=UsageCollector)
    parent_call: str | None = None
    reserved: bool = True
    lease: LeaseSlice | None = None
    """The slice the call was served from (lease mode), else None (a strict reserve)."""
    fn: Any = None
    """The wrapped function (the causal chain digests a partial's arguments)."""
    held: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        """``held``: the reserved amounts by dimension."""
        a = self.amounts
        self.held = {str(a[i]): int(a[i + 1]) for i in range(0, len(a), 2)}


active_call: ContextVar[Call | None] = ContextVar("budget_call", default=None)
"""The wrapped call running here, if any."""


# -- before: reserve, then the pipeline and the breaker ----------------------------------

def begin(state: ContextState, owner: object, kind: Kind, opts: WrapOptions
          ) -> Steps[Call | Outcome]:
    """Reserve, then consult the pipeline and the circuit breaker. Returns the call in
    flight, or the decision that stops it before it runs."""
    call_id, keyed = state.next_call_id()
    if state.stopped is not None:
        return halt(state, kind, opts, call_id, state.stopped, f"context stopped: {state.stopped}")
    if state.closed:
        return halt(state, kind, opts, call_id, "closed", "context is closed")
    amounts = reserve_amounts(opts)
    lease = slice_of(state)
    # covered by the live slice: no store request (so served while Redis is away too)
    served = lease is not None and lease.serve(amounts)
    backend = state.coord.backend
    taking = False  # (a stalled take leaves no hold of the call's to withdraw)
    try:
        if not served:  # a slice take or a reserve: both fail fast while Redis is away
            if not backend.allow():
                raise BackendDown()
            if state.pending_open is not None:
                yield Blocking(state.ensure_open)
            if lease is not None:  # a new slice: one round trip, like a reserve
                taking = True
                served = yield from take_slice(state, lease, amounts)
                taking = False
            if not served:
                res = yield Reserve(state.store, state.path, call_id, amounts, keyed)
    except UNAVAILABLE as exc:
        if is_stall(exc):
            backend.failed(exc)
        if is_stall(exc) and not keyed and not taking:
            # The reserve may have landed without its reply: withdraw it (charging
            # nothing) with the next round trip; if it lands after that, its lease ends it.
            # (A keyed id is left to its lease: a release would mark it finished.)
            state.store.finish(state.path, call_id, outcome="skip", node=None, amounts=[],
                               write_behind=True, queue_only=True)
            state.coord.schedule_flush()
        if state.coord.fail_open:
            log.warning("Redis unavailable; running %s without a budget (fail_open)", call_id)
            return _new_call(state, owner, kind, opts, call_id, amounts, reserved=False)
        err = BackendUnavailableError("reserve", exc)
        return halt(state, kind, opts, call_id, "backend_unavailable", str(err), offline=True)
    if served:
        return (yield from _admit(_new_call(state, owner, kind, opts, call_id, amounts,
                                            lease=lease)))
    if isinstance(res, Replayed):  # finished in an earlier delivery of the same work
        return Outcome(_REPLAYED[res.outcome], reason="replayed",
                       detail=f"call {call_id} already finished ({res.outcome})")
    if not isinstance(res, Held):
        level_id = state.path.ids[res.level] if res.level >= 0 else state.ctx_id
        if res.stopped:
            state.handle_stop(res.reason)
        return halt(state, kind, opts, call_id, res.reason, res.detail, level=level_id)
    state.coord.observe_redis_time(res.now_ms)
    if res.expired:
        reap(state, res.expired)
    return (yield from _admit(_new_call(state, owner, kind, opts, call_id, amounts)))


def _admit(call: Call) -> Steps[Call | Outcome]:
    """Consult the pipeline and the breaker for a call that holds its estimate."""
    state = call.state
    if state.pipeline is None and state.circuit_breaker is None:
        return call
    try:
        refusal = yield Blocking(partial(_consult_before, call))
    except GeneratorExit:
        raise
    except BaseException:  # a hook failed: the call never runs, its hold goes
        _withdraw(call, "error")
        raise
    if isinstance(refusal, Outcome):
        _withdraw(call, "halted")
        if call.token is not state.cancellation_token:
            call.token.detach()
        return refusal
    return call


def _withdraw(call: Call, status: str) -> None:
    """Give back the hold of a call that will not run, without waiting: its slice's
    promise, or a queued release of its reservation."""
    state = call.state
    if call.lease is not None:
        release_promise(call.lease, call.held, node(call, status))
        return
    state.store.finish(state.path, call.call_id, outcome="skip", node=node(call, status),
                       amounts=[], write_behind=True, queue_only=True)
    state.coord.schedule_flush()


def _new_call(state: ContextState, owner: object, kind: Kind, opts: WrapOptions,
              call_id: str, amounts: list[str | int], *, reserved: bool = True,
              lease: LeaseSlice | None = None) -> Call:
    parent_call = active_call.get()
    tool_ctx = None
    if state.pipeline is not None or state.circuit_breaker is not None:
        m = state.metadata
        tool_ctx = ToolCallContext(
            request_id=m.request_id, chain_id=state.ctx_id, node_id=call_id, kind=kind,
            operation_name=opts.operation_name, cost_estimate_usd=opts.cost_estimate_hint,
            provider=opts.provider, model=opts.model or m.model, org_id=m.org_id,
            team=m.team, service=m.service, user_id=m.user_id, tags=dict(m.tags),
        )
    # A call shares its context's token unless it has a timeout of its own.
    token = state.cancellation_token
    if opts.timeout_ms:
        token = CancellationToken(parent=state.cancellation_token)
        state.coord.call_later(opts.timeout_ms / 1000, lambda: token.cancel("timeout"))
    return Call(state, owner, call_id, kind, opts, amounts, tool_ctx, token,
                parent_call=parent_call.call_id if parent_call else None, reserved=reserved,
                lease=lease)


def _consult_before(call: Call) -> Outcome | None:
    """Pipeline hooks, then the circuit breaker (the spec's order, after limits).
    Returns the refusal, or None to go ahead."""
    state = call.state
    if state.pipeline is not None and call.tool_ctx is not None:
        hook = (state.pipeline.before_llm_call if call.kind == "llm"
                else state.pipeline.before_tool_call)
        decision = hook(call.tool_ctx)
        state.mirror_pipeline_events(state.pipeline)
        if decision != Decision.ALLOW:
            if state.circuit_breaker is not None:
                # a probe a window hook took for this call (its lease is renewed
                # until released): the call never runs
                state.circuit_breaker.release()
            return Outcome(decision, reason="pipeline",
                           detail=f"a pipeline hook returned {decision.value}")
    if state.circuit_breaker is not None:
        verdict = state.circuit_breaker.check(PolicyContext(
            cost_usd=call.options.cost_estimate_hint, step_count=0))
        if not verdict.allowed:
            state.record_event(state.event("circuit_open", verdict.reason,
                                           node_id=call.call_id))
            return Outcome(Decision.HALT, reason="circuit_open", detail=verdict.reason)
    return None


def halt(state: ContextState, kind: Kind, opts: WrapOptions, call_id: str, reason: str,
         detail: str, *, offline: bool = False, level: str | None = None) -> Outcome:
    """Record a refused call: its node (with the reason) always, the chain-level
    event once per reason per context (the reference's de-duplication); HALT. Refusals
    while Redis is away record one event per run of them (a stalled Redis refuses
    thousands)."""
    outcome = Outcome(Decision.HALT, reason=reason, detail=detail)
    if offline and state.offline_events and state.offline_events[-1].event_type == reason:
        return outcome
    meta: dict[str, Any] = {"node_id": call_id, "operation_name": opts.operation_name}
    if level is not None and level != state.ctx_id:
        meta["stopped_at"] = level
    event = state.event(reason, detail or reason, **meta)
    if offline:
        events = state.offline_events
        events.append(event)
        if len(events) > 2 * MAX_OFFLINE_EVENTS:
            del events[:-MAX_OFFLINE_EVENTS]
        return outcome
    status = reason if reason in ("aborted", "timeout") else "halted"
    now = time.time()
    record = {"node_id": call_id, "kind": kind, "operation_name": opts.operation_name,
              "start_ts": now, "end_ts": now, "status": status, "stop_reason": reason,
              "stop_detail": detail or reason}
    state.store.queue_stop_event(state.path, reason, event.model_dump_json())
    state.store.queue_node(state.path, json.dumps(record))
    state.coord.schedule_flush()
    return outcome


# -- after: what it spent, and how it ended ----------------------------------------------

def node(call: Call, status: str, *, cost_micro: int = 0, tin: int = 0, tout: int = 0,
         retries: int = 0, usage: Usage | None = None) -> dict[str, Any]:
    """The node record of a call (a NodeRecord's fields)."""
    return {
        "node_id": call.call_id, "parent_id": call.parent_call, "kind": call.kind,
        "operation_name": call.options.operation_name, "start_ts": call.start_ts,
        "end_ts": time.time(), "status": status, "cost_usd": micro_to_usd(cost_micro),
        "retries_used": retries, "input_tokens": tin, "output_tokens": tout,
        "provider": (usage.provider if usage else None) or call.options.provider,
        "model": (usage.model if usage else None) or call.options.model,
    }


def spent(call: Call, usage: Usage | None, *, default_to_estimate: bool
          ) -> tuple[int, int, int, str | None]:
    """(micro-USD, input tokens, output tokens, provider) to charge for a call.

    Reported or response-carried usage wins; tokens are priced when no cost came
    with them; what stays unknown is charged at the estimate (or 0)."""
    est = call.held
    cost: int | None = None
    tin = tout = 0
    if usage is not None:
        if usage.cost_usd is not None:
            cost = usd_to_micro(usage.cost_usd)
        if usage.has_tokens:
            tin, tout = usage.input_tokens, usage.output_tokens
            if cost is None:
                priced = pricing.price_usd(
                    usage.model or call.options.model, tin, tout,
                    cache_read_input_tokens=usage.cache_read_input_tokens,
                    cache_creation_input_tokens=usage.cache_creation_input_tokens,
                    provider=usage.provider or call.options.provider)
                cost = usd_to_micro(priced) if priced is not None else None
    if default_to_estimate:
        if cost is None:
            cost = est.get("usd", 0)
        if usage is None or not usage.has_tokens:
            tin, tout = est.get("tin", 0), est.get("tout", 0)
    provider = (usage.provider if usage else None) or call.options.provider
    return cost or 0, tin, tout, provider


def complete(call: Call, result: Any) -> Steps[Outcome]:
    """Settle a call that returned: what it reported (or its response carries) is
    charged, and written behind when it fits in what was held."""
    state = call.state
    if call.kind == "tool":
        record_capability(call, result=result)
    try:
        usage = call.collector.usage or usage_from_response(result)
        cost, tin, tout, provider = spent(call, usage, default_to_estimate=True)
    except Exception as exc:  # noqa: BLE001 - the response's usage cannot be taken
        yield from _charge_estimate(call)
        raise InvalidUsageError(f"call {call.call_id} ran, but its usage cannot be "
                                f"charged ({exc}); its estimate was charged") from exc
    decision = Decision.ALLOW
    hook_error: BaseException | None = None
    if state.pipeline is not None or state.circuit_breaker is not None:
        try:
            decision = yield Blocking(partial(_after_success, call, cost))
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the money is spent whatever a hook does
            hook_error = exc
    if call.reserved:
        amounts = actual_amounts(cost, tin, tout, provider)
        held = call.held
        within = all(int(amounts[i + 1]) <= held.get(str(amounts[i]), 0)
                     for i in range(0, len(amounts), 2))
        record = node(call, "ok", cost_micro=cost, tin=tin, tout=tout, usage=usage)
        yield from finish(call, "ok", record, amounts, write_behind=within)
    if hook_error is not None:
        raise hook_error
    return Outcome(decision, result)


def _after_success(call: Call, cost: int) -> Decision:
    """The pipeline's ``before_charge`` hooks and the breaker's success (they may read
    Redis)."""
    state = call.state
    decision = Decision.ALLOW
    if state.pipeline is not None and call.tool_ctx is not None:
        # before_charge decides for LLM calls only (the reference's rule): a tool call
        # that already ran is not turned into a HALT; hooks still learn its cost.
        if call.kind == "llm":
            decision = state.pipeline.before_charge(call.tool_ctx, micro_to_usd(cost))
        else:
            state.pipeline.charged(call.tool_ctx, micro_to_usd(cost))
        state.mirror_pipeline_events(state.pipeline)
    if state.circuit_breaker is not None:
        state.circuit_breaker.record_success()
    return decision


def _charge_estimate(call: Call) -> Steps[None]:
    """Settle a call that ran but whose usage cannot be read or priced at its estimate
    (it was billed, for an unknown amount); it counts no step and no retry."""
    cost, tin, tout, provider = spent(call, None, default_to_estimate=True)
    record = node(call, "error", cost_micro=cost, tin=tin, tout=tout)
    yield from finish(call, "skip", record, actual_amounts(cost, tin, tout, provider),
                      write_behind=True)


def fail(call: Call, exc: BaseException) -> Steps[Outcome | None]:
    """Settle a call that did not complete. Returns the outcome, or None to re-raise
    (interpreter exits, outer cancellations, bad usage reports)."""
    state = call.state
    if call.kind == "tool":
        record_capability(call, error=exc)
    usage = call.collector.usage
    if state.circuit_breaker is not None and (
        isinstance(exc, (CancelledByContext, *_LIMIT_ERRORS)) or not isinstance(exc, Exception)
    ):
        # not a provider failure: free a probe it held
        yield Blocking(state.circuit_breaker.release)
    if isinstance(exc, CancelledByContext):
        reason = exc.reason if exc.reason in ("aborted", "timeout") else "aborted"
        # Work was in flight when it was cancelled: charge what it reported, else its
        # estimate (it may have been billed).
        cost, tin, tout, provider = spent(call, usage, default_to_estimate=True)
        record = node(call, reason, cost_micro=cost, tin=tin, tout=tout, usage=usage)
        yield from finish(call, "skip", record, actual_amounts(cost, tin, tout, provider),
                          write_behind=False)
        if not state.cancellation_token.cancelled:  # the call's own timeout
            state.record_event(state.event("timeout", f"call exceeded "
                                           f"{call.options.timeout_ms} ms",
                                           node_id=call.call_id, scope="call"))
        return Outcome(Decision.HALT, reason=reason, error=exc)
    cost, tin, tout, provider = spent(call, usage, default_to_estimate=False)
    amounts = actual_amounts(cost, tin, tout, provider)
    if not isinstance(exc, Exception) or isinstance(exc, (InvalidCostError,
                                                        InvalidUsageError)):
        # Interpreter exits, outer cancellations and bad usage reports propagate; the
        # call counts no retry, and what it validly reported is still charged.
        record = node(call, "error", cost_micro=cost, tin=tin, tout=tout, usage=usage)
        yield from finish(call, "skip", record, amounts, write_behind=True)
        return None
    limit_error = next((r for t, r in _LIMIT_ERRORS.items() if isinstance(exc, t)), None)
    if limit_error is not None:
        # A tool gave up on a limit (Limits specification): no retry is counted.
        reason = limit_error
        record = node(call, "timeout" if reason == "timeout" else "halted",
                      cost_micro=cost, tin=tin, tout=tout, usage=usage)
        yield from finish(call, "skip", record, amounts, write_behind=False)
        state.record_event(state.event(reason, f"{type(exc).__name__}: {exc}",
                                       node_id=call.call_id, scope="tool"))
        return Outcome(Decision.HALT, reason=reason, detail=str(exc), error=exc)
    decision = Decision.RETRY
    if state.pipeline is not None or state.circuit_breaker is not None:
        decision = yield Blocking(partial(_after_error, call, exc))
    record = node(call, "error", cost_micro=cost, tin=tin, tout=tout, retries=1, usage=usage)
    stops = yield from finish(call, "error", record, amounts, write_behind=False)
    if any(s.reason == "retry_budget_exceeded" for s in stops) or (
        state.stopped == "retry_budget_exceeded"
    ):
        state.record_event(state.event(
            "provider_error",
            f"{type(exc).__name__}: {exc} (retry budget exhausted)",
            node_id=call.call_id))
        return Outcome(Decision.HALT, reason="provider_error", detail=str(exc), error=exc)
    return Outcome(decision, reason=None if decision == Decision.RETRY else "pipeline",
                   error=exc)


def _after_error(call: Call, exc: BaseException) -> Decision:
    """The pipeline's ``on_error`` hooks and the breaker's failure (they may read Redis)."""
    state = call.state
    decision = Decision.RETRY
    if state.pipeline is not None and call.tool_ctx is not None:
        decision = state.pipeline.on_error(call.tool_ctx, exc)
        state.mirror_pipeline_events(state.pipeline)
    if state.circuit_breaker is not None:
        state.circuit_breaker.record_failure()
    return decision


def record_capability(call: Call, *, result: Any = None,
                      error: BaseException | None = None) -> None:
    """Queue the CapabilityCall event of a tool call on its tree's causal chain
    (coordinator/data/chain.py: digests and sizes only, never the data)."""
    state = call.state
    capability_called(state.coord, state.path, state.metadata,
                      operation=call.options.operation_name, node_id=call.call_id,
                      fn=call.fn, result=result, error=error)


def finish(call: Call, outcome: str, record: dict[str, Any], amounts: list[str | int], *,
           write_behind: bool) -> Steps[list[Stop]]:
    """Settle or release the call's reservation; apply the stops it caused here."""
    if not call.reserved:
        return []
    state = call.state
    if call.lease is not None:  # served from a slice: settled in-process (lease.py)
        stops = yield from finish_served(call.lease, call.held, outcome, record, amounts,
                                         now=not write_behind)
    else:
        done: tuple[list[Stop], bool] = yield Blocking(
            partial(_finish_now, call, outcome, record, amounts, write_behind))
        stops, behind = done
        if behind:
            state.coord.schedule_flush()
    for stop in stops:
        if stop.ctx_id in state.path.ids:
            state.handle_stop(stop.reason)
    return stops


def _finish_now(call: Call, outcome: str, record: dict[str, Any], amounts: list[str | int],
                write_behind: bool) -> tuple[list[Stop], bool]:
    """(the stops, whether it went behind): written behind when asked, or queued while
    Redis is down (if it never lands, the lease charges the estimate)."""
    state = call.state
    store, backend = state.store, state.coord.backend
    args: dict[str, Any] = {"outcome": outcome, "node": record, "amounts": amounts}
    if backend.allow():
        try:
            stops = store.finish(state.path, call.call_id, write_behind=write_behind, **args)
            return stops, write_behind
        except UNAVAILABLE as exc:
            backend.failed(exc)
    store.finish(state.path, call.call_id, write_behind=True, queue_only=True, **args)
    return [], True
