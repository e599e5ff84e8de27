"""The pipeline's hooks and the circuit breaker around a call, as requests of its steps:
they are user code that may read Redis, so a call's steps yield them (plain data) and the
executor (executor.py) runs them where waiting is allowed, in the caller's context
variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.amounts import micro_to_usd
from ..models import Decision
from ..shield.pipeline import ToolCallContext
from ..shield.policy import PolicyContext
from .state import ContextState


@dataclass(frozen=True)
class BeforeCall:
    """Consult the pipeline's ``before_*_call`` hook, then the circuit breaker, for a call
    that holds its estimate. Reply: a :class:`HookRefusal`, or None to go ahead."""

    node_id: str
    kind: str
    tool_ctx: ToolCallContext | None
    cost_estimate_usd: float
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class AfterReturn:
    """A call returned, charged ``cost`` micro-USD: the pipeline's ``before_charge`` (an
    LLM call's decides) or ``charged`` hook, and the breaker's success. Reply: the
    Decision."""

    kind: str
    tool_ctx: ToolCallContext | None
    cost: int
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class AfterRaise:
    """A call raised a retryable ``error``: the pipeline's ``on_error`` hook and the
    breaker's failure. Reply: the Decision."""

    tool_ctx: ToolCallContext | None
    error: BaseException
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class ReleaseProbe:
    """Free a probe the circuit breaker lent the call (it never ran, or its failure was
    not the provider's). Reply: None."""

    waits: ClassVar[bool] = True


HookRequest = BeforeCall | AfterReturn | AfterRaise | ReleaseProbe


@dataclass(frozen=True)
class HookRefusal:
    """A hook or the breaker refused a call before it ran."""

    decision: Decision
    reason: str
    detail: str


def before_call(state: ContextState, r: BeforeCall) -> HookRefusal | None:
    """Pipeline hooks, then the circuit breaker (the spec's order, after limits)."""
    if state.pipeline is not None and r.tool_ctx is not None:
        hook = (state.pipeline.before_llm_call if r.kind == "llm"
                else state.pipeline.before_tool_call)
        decision = hook(r.tool_ctx)
        state.mirror_pipeline_events(state.pipeline)
        if decision != Decision.ALLOW:
            if state.circuit_breaker is not None:
                # a probe a window hook took for this call (its lease is renewed
                # until released): the call never runs
                state.circuit_breaker.release()
            return HookRefusal(decision, "pipeline", f"a pipeline hook returned {decision.value}")
    if state.circuit_breaker is not None:
        verdict = state.circuit_breaker.check(PolicyContext(
            cost_usd=r.cost_estimate_usd, step_count=0))
        if not verdict.allowed:
            state.record_event(state.event("circuit_open", verdict.reason, node_id=r.node_id))
            return HookRefusal(Decision.HALT, "circuit_open", verdict.reason)
    return None


def after_return(state: ContextState, r: AfterReturn) -> Decision:
    """The pipeline's ``before_charge`` hooks and the breaker's success."""
    decision = Decision.ALLOW
    if state.pipeline is not None and r.tool_ctx is not None:
        # before_charge decides for LLM calls only (the reference's rule): a tool call
        # that already ran is not turned into a HALT; hooks still learn its cost.
        if r.kind == "llm":
            decision = state.pipeline.before_charge(r.tool_ctx, micro_to_usd(r.cost))
        else:
            state.pipeline.charged(r.tool_ctx, micro_to_usd(r.cost))
        state.mirror_pipeline_events(state.pipeline)
    if state.circuit_breaker is not None:
        state.circuit_breaker.record_success()
    return decision


def after_raise(state: ContextState, r: AfterRaise) -> Decision:
    """The pipeline's ``on_error`` hooks and the breaker's failure."""
    decision = Decision.RETRY
    if state.pipeline is not None and r.tool_ctx is not None:
        decision = state.pipeline.on_error(r.tool_ctx, r.error)
        state.mirror_pipeline_events(state.pipeline)
    if state.circuit_breaker is not None:
        state.circuit_breaker.record_failure()
    return decision


def release_probe(state: ContextState, _: ReleaseProbe) -> None:
    """Free the breaker's probe, if it lent one."""
    if state.circuit_breaker is not None:
        state.circuit_breaker.release()
