"""One call's reserve -> run -> settle: reserve its estimate at every level and consult the
pipeline and the circuit breaker (``begin``); the node record and the settle or release
of its reservation (``finish``) that settling.py's ``complete`` and ``fail`` use. The sync
and async loops that run the call between these steps are in wrap.py.

The steps are generators yielding plain requests (store/requests.py, hooks.py) and
receiving their replies (steps.py drives them in the caller's thread or from an event
loop, executor.py answers them): one implementation for both, and a unit test feeds them
scripted replies. A call refused by a ceiling may wait for an operator's raise first
(approval_steps.py, ExecutionConfig.approval_wait_s). While the backend
breaker is open (Redis stalled), a call fails closed before anything is sent, unless a
live lease slice covers it (lease_steps.py: such a call yields no request at all)."""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.amounts import micro_to_usd, reserve_amounts
from ..core.charging_rules import Charge, strict_refusal
from ..core.usage import Usage, UsageCollector
from ..core.vocabulary import FinishOutcome, NodeStatus, StopReason
from ..data.chain import capability_event
from ..errors import BackendUnavailableError
from ..models import Decision, WrapOptions
from ..models_records import NodeFields, encode_node
from ..quotas.steps import grant_short, refill_and_reserve
from ..shield.pipeline import ToolCallContext
from ..store.errors import UNAVAILABLE
from ..store.health import BackendDown, is_stall
from ..store.requests import ChainEvent, EdgeTerms, Finish, Flush, Open, Reap, Refusal, Reserve
from ..store.tree import Held, Refused, Replayed, Stop
from .approval_steps import wait_for_approval, waits_for
from .cancellation import CancellationToken
from .edge import chosen_rung, edge_terms
from .failures import add_error
from .hooks import BeforeCall, HookRefusal
from .lease import LeaseSlice
from .lease_registry import slice_of
from .lease_steps import finish_served, release_promise, take_slice
from .state import ContextState
from .steps import Steps

log = logging.getLogger("coordinator")

Kind = Literal["llm", "tool"]
REPLAYED_DECISIONS = {FinishOutcome.OK: Decision.ALLOW, FinishOutcome.ERROR: Decision.RETRY,
                      FinishOutcome.SKIP: Decision.HALT, FinishOutcome.HALTED: Decision.HALT}
"""What a replayed call decides, by how its first delivery finished (reserve.lua's
replay reply)."""
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
    settled: NodeFields | None = None
    """The node record it was settled or released with (its span reads it)."""
    model: str | None = None
    """The model it runs on: its model ladder's choice (edge.py), else the option's."""
    degraded_from: str | None = None
    """The model it asked for, when the ladder chose a cheaper one."""
    final: bool = False
    """It may spend the final reserve (``WrapOptions.final``, ``ctx.finishing()``)."""
    held: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        """``held``: the reserved amounts by dimension."""
        a = self.amounts
        self.held = {str(a[i]): int(a[i + 1]) for i in range(0, len(a), 2)}
        if self.model is None:
            self.model = self.options.model


active_call: ContextVar[Call | None] = ContextVar("budget_call", default=None)
"""The wrapped call running here, if any."""


# -- before: reserve, then the pipeline and the breaker ----------------------------------

def begin(state: ContextState, owner: object, kind: Kind, opts: WrapOptions
          ) -> Steps[Call | Outcome]:
    """Reserve, then consult the pipeline and the circuit breaker. Returns the call in
    flight, or the decision that stops it before it runs."""
    call_id, keyed = state.next_call_id()
    if state.stopped is not None and not waits_for(state, state.stopped):
        # the same words as reserve.lua's refusal of a stopped level: whether this process
        # heard the stop (pub/sub) or learns it from Redis is a race, and the records of
        # one stop must not differ by who won it (the dashboard folds identical ones)
        return (yield from halt(state, kind, opts, call_id, state.stopped,
                                f"stopped: {state.stopped}"))
    if state.closed:
        return (yield from halt(state, kind, opts, call_id, StopReason.CLOSED,
                                "context is closed"))
    unpriced = strict_refusal(opts.model, opts.provider, state.coord.charging)
    if unpriced is not None:
        return (yield from halt(state, kind, opts, call_id, StopReason.UNPRICED_MODEL,
                                unpriced))
    # an LLM call holds at least the floor it is charged if it reports nothing
    floor = state.coord.charging.floor_micro if kind == "llm" else 0
    amounts = reserve_amounts(opts, floor)
    terms = edge_terms(state, opts, int(amounts[1]), floor)
    rungs = terms.rungs
    if rungs:  # the requested model's worst case, until the slice or reserve.lua chooses
        amounts[1] = rungs[1]
    lease = slice_of(state)
    # covered by the live slice: no store request (so served while Redis is away too);
    # never while a ceiling stop heard here makes the call wait for approval. A ladder
    # call: on the rung the slice chooses (lease_rungs.py), its number
    served: int = lease is not None and state.stopped is None and (
        lease.serve(amounts) if not rungs else lease.serve_rung(amounts, rungs))
    backend = state.coord.backend
    taking = False  # (a stalled take leaves no hold of the call's to withdraw)
    try:
        if not served:  # a slice take or a reserve: both fail fast while Redis is away
            if not backend.allow(state.backend_key):
                raise BackendDown()
            if state.pending_open is not None:
                yield Open(state.ctx_id)
            if lease is not None:  # a new slice: one round trip, like a reserve
                taking = True
                served = yield from take_slice(state, lease, amounts, rungs)
                taking = False
            if not served:
                mark = state.store.wire.write_mark()
                res = yield from _reserve(state, call_id, amounts, keyed, terms)
                if isinstance(res, Refused) and (res.expired or (
                        res.level >= 0 and not res.stopped
                        and state.store.wire.wrote_since(mark))):
                    # what left no room may be holds whose process stopped renewing them
                    # (settle them), or this process's own settles still on their way
                    # (sent by the flusher): let them land and ask once more
                    if res.expired:
                        yield Reap(state.path, res.expired)
                    yield Flush()
                    res = yield from _reserve(state, call_id, amounts, keyed, terms)
                if isinstance(res, Refused) and waits_for(state, res.reason):
                    res = yield from wait_for_approval(
                        state, res, lambda: _reserve(state, call_id, amounts, keyed, terms))
    except UNAVAILABLE as exc:
        if is_stall(exc):
            backend.failed(exc, state.backend_key)
        if is_stall(exc) and not keyed and not taking:
            # The reserve may have landed without its reply: withdraw it (charging
            # nothing) with the next round trip; if it lands after that, its lease ends it.
            # (A keyed id is left to its lease: a release would mark it finished.)
            yield Finish(state.path, call_id, FinishOutcome.SKIP, None, [], write_behind=True)
        if state.coord.fail_open:
            log.warning("Redis unavailable; running %s without a budget (fail_open)", call_id)
            return _new_call(state, owner, kind, opts, call_id, amounts, reserved=False)
        err = BackendUnavailableError("reserve", exc)
        return (yield from halt(state, kind, opts, call_id, StopReason.BACKEND_UNAVAILABLE,
                                str(err), offline=True))
    if served:  # (rung 1, the requested model, is what _new_call makes)
        return (yield from _admit(
            _on_rung(state, owner, kind, opts, call_id, amounts, terms, served, lease)
            if served > 1 else _new_call(state, owner, kind, opts, call_id, amounts,
                                         lease=lease, final=terms.final)))
    if isinstance(res, Replayed):  # finished in an earlier delivery of the same work
        return Outcome(REPLAYED_DECISIONS[FinishOutcome(res.outcome)], reason="replayed",
                       detail=f"call {call_id} already finished ({res.outcome})")
    if not isinstance(res, Held):
        level_id = state.path.ids[res.level] if res.level >= 0 else state.ctx_id
        if res.stopped:
            state.handle_stop(res.reason)
        return (yield from halt(state, kind, opts, call_id, res.reason, res.detail,
                                level=level_id))
    state.coord.observe_redis_time(res.now_ms)
    if res.expired:
        yield Reap(state.path, res.expired)
    return (yield from _admit(_on_rung(state, owner, kind, opts, call_id, amounts, terms,
                                       res.rung, None)))


def _on_rung(state: ContextState, owner: object, kind: Kind, opts: WrapOptions, call_id: str,
             amounts: list[str | int], terms: EdgeTerms, rung_no: int,
             lease: LeaseSlice | None) -> Call:
    """The call, on rung ``rung_no`` of its ladder (reserve.lua's or the slice's choice,
    from 1) when it has one: what is held, and what runs."""
    rung = chosen_rung(terms, rung_no)
    if rung is not None:
        amounts[1] = rung[1]
    call = _new_call(state, owner, kind, opts, call_id, amounts, lease=lease,
                     final=terms.final)
    if rung is not None:
        call.model = rung[0]
        if rung[0] != opts.model:
            call.degraded_from = opts.model
    return call


def _reserve(state: ContextState, call_id: str, amounts: list[str | int], keyed: bool,
             terms: EdgeTerms) -> Steps[Held | Refused | Replayed]:
    """Hold the call's estimate at every level (one round trip), topping up a quota grant
    of the tree that is short (quotas/)."""
    request = Reserve(state.path, call_id, amounts, keyed, resend=state.has_time_to_resend(),
                      terms=terms)
    res: Held | Refused | Replayed = yield request
    state.coord.backend.succeeded(state.backend_key)
    if grant_short(res):
        res = yield from refill_and_reserve(request, res)
    return res


def _admit(call: Call) -> Steps[Call | Outcome]:
    """Consult the pipeline and the breaker for a call that holds its estimate."""
    state = call.state
    if state.pipeline is None and state.circuit_breaker is None:
        return call
    try:
        refusal: HookRefusal | None = yield BeforeCall(
            call.call_id, call.kind, call.tool_ctx, call.options.cost_estimate_hint)
    except GeneratorExit:
        raise
    except BaseException:  # a hook failed: the call never runs, its hold goes
        yield from _withdraw(call, NodeStatus.ERROR)
        raise
    if refusal is not None:
        yield from _withdraw(call, NodeStatus.HALTED, refusal.reason)
        if call.token is not state.cancellation_token:
            call.token.detach()
        return Outcome(refusal.decision, reason=refusal.reason, detail=refusal.detail)
    return call


def _withdraw(call: Call, status: NodeStatus, refused_by: str | None = None) -> Steps[None]:
    """Give back the hold of a call that will not run, without waiting: its slice's
    promise, or a queued release of its reservation (``refused_by``: the refusal's
    reason, counted as one)."""
    state = call.state
    record = node(call, status)
    if refused_by is not None:
        record["stop_reason"] = refused_by
    if call.lease is not None:
        release_promise(call.lease, call.held, record)
        return
    yield Finish(state.path, call.call_id, FinishOutcome.SKIP, record, [], write_behind=True)


def _new_call(state: ContextState, owner: object, kind: Kind, opts: WrapOptions,
              call_id: str, amounts: list[str | int], *, reserved: bool = True,
              lease: LeaseSlice | None = None, final: bool = False) -> Call:
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
        state.coord.call_later(opts.timeout_ms / 1000, lambda: token.cancel(StopReason.TIMEOUT))
    return Call(state, owner, call_id, kind, opts, amounts, tool_ctx, token,
                parent_call=parent_call.call_id if parent_call else None, reserved=reserved,
                lease=lease, final=final)


def halt(state: ContextState, kind: Kind, opts: WrapOptions, call_id: str, reason: str,
         detail: str, *, offline: bool = False, level: str | None = None) -> Steps[Outcome]:
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
    status = (NodeStatus(reason) if reason in (StopReason.ABORTED, StopReason.TIMEOUT)
              else NodeStatus.HALTED)
    now = time.time()
    record: NodeFields = {
        "node_id": call_id, "kind": kind, "operation_name": opts.operation_name,
        "start_ts": now, "end_ts": now, "status": status, "stop_reason": reason,
        "stop_detail": detail or reason}
    yield Refusal(state.path, reason, event.model_dump_json(), encode_node(record))
    return outcome


# -- after: what it spent, and how it ended ----------------------------------------------

def node(call: Call, status: NodeStatus, *, charge: Charge | None = None, retries: int = 0,
         steps: int = 0, usage: Usage | None = None, error: BaseException | None = None
         ) -> NodeFields:
    """The node record of a call: what it was charged and by which rule, what it
    counted, and the error it raised."""
    record: NodeFields = {
        "node_id": call.call_id, "parent_id": call.parent_call, "kind": call.kind,
        "operation_name": call.options.operation_name, "start_ts": call.start_ts,
        "end_ts": time.time(), "status": status,
        "cost_usd": micro_to_usd(charge.cost) if charge else 0.0,
        "retries_used": retries, "steps_used": steps,
        "input_tokens": charge.tin if charge else 0,
        "output_tokens": charge.tout if charge else 0,
        "provider": (usage.provider if usage else None) or call.options.provider,
        "model": (usage.model if usage else None) or call.model,
        "charged_by": charge.rule if charge else "none",
    }
    if call.degraded_from is not None:
        record["degraded_from"] = call.degraded_from
    if charge is not None and charge.unreported:
        record["unreported"] = True
    if error is not None:
        add_error(record, error)
    return record


def record_capability(call: Call, *, result: Any = None,
                      error: BaseException | None = None) -> Steps[None]:
    """Queue the CapabilityCall event of a tool call on its tree's causal chain
    (coordinator/data/chain.py: digests and sizes only, never the data)."""
    state = call.state
    event = capability_event(state.path, state.metadata,
                             operation=call.options.operation_name, node_id=call.call_id,
                             fn=call.fn, result=result, error=error)
    if event is not None:
        yield ChainEvent(state.path.root, event)


def finish(call: Call, outcome: FinishOutcome, record: NodeFields, amounts: list[str | int], *,
           write_behind: bool) -> Steps[list[Stop]]:
    """Settle or release the call's reservation; apply the stops it caused here."""
    call.settled = record
    if not call.reserved:
        return []
    state = call.state
    if call.lease is not None:  # served from a slice: settled in-process (lease.py)
        stops = yield from finish_served(call.lease, call.held, outcome, record, amounts,
                                         now=not write_behind)
    else:
        stops = yield Finish(state.path, call.call_id, outcome, record, amounts, write_behind)
    for stop in stops:
        if stop.ctx_id in state.path.ids:
            state.handle_stop(stop.reason)
    return stops

