"""ExecutionContext: the public facade of a context, chain-level containment whose state
lives in Redis so that one set of limits holds for a whole tree of agents in any process
on any machine; and the context variables saying which context runs here.

Ids, one name each: a *context id* names a context (the public API and the records call
it ``chain_id``); the *root* is the context id of a tree's root; a *call id* names one
wrapped call and is also the *reservation id* of its hold (the node records call it
``node_id``); a ledger reservation has a reservation id of its own. docs/architecture.md
has the whole glossary."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any

from ..core.plans import child_plan, open_plan
from ..data import chain as data_chain
from ..data.lifecycle import check_step_name, init_child
from ..data.model import IsolationLevel
from ..models import (
    ActiveLimits,
    ChainMetadata,
    ContextSnapshot,
    Decision,
    ExecutionConfig,
    LeasePolicy,
    SafetyEvent,
    TokenBudget,
    WrapOptions,
)
from ..runtime.coordinator import Coordinator
from ..shield.pipeline import ShieldPipeline, ToolCallContext
from .async_members import MAX_REASON, ContextAsyncMembers
from .call import active_call
from .cancellation import CancellationToken
from .charging import propagate_child_cost
from .closing import close_context, detach_context
from .data_members import ContextDataMembers
from .identity_members import ContextIdentityMembers
from .lease_registry import flush_lease
from .opening import (
    attach_state,
    check_type,
    open_pending,
    open_state,
    token_state,
)
from .reading import load_snapshot, snapshot
from .state import ContextState
from .wrap import run_sync

active_context: ContextVar[ExecutionContext | None] = ContextVar("budget_ctx", default=None)
"""The context of the ``with`` block (or request) running here, if any."""


def current_context() -> ExecutionContext | None:
    """The context of the wrapped call (or ``with`` block) running here, if any."""
    call = active_call.get()
    if call is not None and isinstance(call.owner, ExecutionContext):
        return call.owner
    return active_context.get()


def current_limits() -> ActiveLimits | None:
    """The limits in force for the running code (deadline, remaining tokens and USD, the
    tightest over the whole path), or None outside any context. One Redis round trip."""
    ctx = current_context()
    return ctx.limits() if ctx is not None else None


def current_cancellation_token() -> CancellationToken | None:
    """The token of the wrapped call running here (set on abort, timeout, or the call's own
    timeout); synchronous functions poll it."""
    call = active_call.get()
    if call is not None:
        return call.token
    ctx = active_context.get()
    return ctx.cancellation_token if ctx is not None else None


class ExecutionContext(ContextIdentityMembers, ContextAsyncMembers, ContextDataMembers):
    """Containment for one chain (agent run) that bounds its whole subtree.

    ``with ExecutionContext(config) as ctx`` opens the context in Redis and closes it on
    exit; ``ExecutionContext.attach(token)`` joins an existing one from any process.
    Its context data (``data``, ``checkpoint``, ``parallel``...) comes from
    :class:`~coordinator.context.data_members.ContextDataMembers`, its ids and settings
    from :class:`~coordinator.context.identity_members.ContextIdentityMembers`, its async
    twins from :class:`~coordinator.context.async_members.ContextAsyncMembers`, and
    ``evaluate``, ``limits`` and ``ledger`` from
    :class:`~coordinator.context.limits_members.ContextLimitsMembers`.
    """

    # -- construction --------------------------------------------------------------------

    def __init__(
        self,
        config: ExecutionConfig,
        pipeline: ShieldPipeline | None = None,
        metadata: ChainMetadata | None = None,
        parent: ExecutionContext | None = None,
        *,
        coordinator: Coordinator | None = None,
        circuit_breaker: Any | None = None,
    ) -> None:
        check_type("config", config, ExecutionConfig)
        if parent is not None:
            check_type("parent", parent, ExecutionContext)
        coord = coordinator or (parent._state.coord if parent is not None
                                else Coordinator.default())
        self._init(open_state(coord, open_plan(config, is_child=parent is not None),
                              pipeline, metadata, parent._state if parent else None,
                              circuit_breaker), parent)

    def _init(self, state: ContextState, parent: ExecutionContext | None) -> None:
        self._state = state
        self.parent = parent
        self._ctx_token: Any = None

    @classmethod
    def _from_state(cls, state: ContextState, parent: ExecutionContext | None = None
                    ) -> ExecutionContext:
        ctx = cls.__new__(cls)
        ctx._init(state, parent)
        return ctx

    @classmethod
    def attach(cls, token: str, coordinator: Coordinator | None = None) -> ExecutionContext:
        """A handle to the context a token names, from any process. Raises a
        :class:`~coordinator.errors.TokenError` for a bad token and
        :class:`~coordinator.errors.ContextNotFoundError` when the context is gone.
        Leaving a ``with`` block of an attached handle flushes it; it does not close the
        context (its owner does)."""
        return cls._from_state(attach_state(coordinator or Coordinator.default(), token))

    @classmethod
    def spawn_from_token(
        cls,
        token: str,
        coordinator: Coordinator | None = None,
        **limits: Any,
    ) -> ExecutionContext:
        """Open a child of the context a token names, in one round trip: the same as
        ``attach(token).spawn_child(**limits)`` without reading the parent first (the open
        script checks that every ancestor exists at the place the token says)."""
        parent = cls._from_state(token_state(coordinator or Coordinator.default(), token))
        return parent.spawn_child(**limits)

    @classmethod
    def load_snapshot(cls, chain_id: str, coordinator: Coordinator | None = None
                      ) -> ContextSnapshot:
        """The current state of any context, from any process (including one stopped or
        closed: its state was persisted in Redis at every step)."""
        return load_snapshot(coordinator or Coordinator.default(), chain_id)

    def spawn_child(
        self,
        max_cost_usd: float | None = None,
        max_steps: int | None = None,
        max_retries_total: int | None = None,
        timeout_ms: int = 0,
        pipeline: ShieldPipeline | None = None,
        *,
        token_budget: TokenBudget | None = None,
        deadline: datetime | None = None,
        metadata: ChainMetadata | None = None,
        isolation: IsolationLevel | str = IsolationLevel.INHERIT,
        step_name: str | None = None,
        is_parallel: bool = False,
        lease: LeasePolicy | bool | None = None,
    ) -> ExecutionContext:
        """Open a child context. Cost (and every token dimension) defaults to what remains
        above; steps and retries to the parent's limits. Explicit limits are tightened to
        what remains above; every ancestor's limits keep applying. ``isolation`` sets how
        the child reads its ancestors' data; a ``step_name`` makes it a step of the causal
        chain (docs/context-data.md). ``lease``: the parent's lease policy unless given
        (False: strict reserves; docs/leases.md)."""
        iso = IsolationLevel.of(isolation)
        check_step_name(step_name)
        plan = child_plan(self.config, max_cost_usd, max_steps, max_retries_total, timeout_ms,
                          token_budget, deadline, lease)
        state = open_state(self._state.coord, plan, pipeline, metadata, self._state,
                           self.circuit_breaker)
        child = ExecutionContext._from_state(state, self)
        init_child(state, state.coord, state.path, iso, step_name=step_name,
                   is_parallel=bool(is_parallel), metadata=state.metadata, close=child.close)
        return child

    # -- with / async with ---------------------------------------------------------------

    def __enter__(self) -> ExecutionContext:
        self._ctx_token = active_context.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._ctx_token is not None:
            try:
                active_context.reset(self._ctx_token)
            except ValueError:  # exited in another context (e.g. another task)
                active_context.set(None)
            self._ctx_token = None
        data_chain.step_failed(self._state, exc)
        self.close()

    async def __aenter__(self) -> ExecutionContext:
        """Open the context (made on an event loop, the constructor left that to here)
        off the event loop."""
        if self._state.pending_open is not None:
            await asyncio.to_thread(open_pending, self._state)
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._ctx_token is not None:
            try:
                active_context.reset(self._ctx_token)
            except ValueError:  # exited in another context (e.g. another task)
                active_context.set(None)
            self._ctx_token = None
        await self.aclose()

    def close(self) -> None:
        """Flush this process's queued writes and, if this handle opened the context,
        close it in Redis (later calls in it and below it halt; keys expire after the
        coordinator's retention). Idempotent."""
        close_context(self._state)

    def detach(self) -> None:
        """Let go of this handle without closing the context: flush this process's writes
        and start the retention clock on the context's keys, but leave it open for work
        still running under it elsewhere (sub-tasks sent by a task that has returned).
        Its tree's root closing still ends it. Idempotent; ``close`` after it is a no-op."""
        detach_context(self._state)

    # -- stops and events ----------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Stop this context and its whole subtree, in every process, durably. Running
        work is cancelled through pub/sub. If Redis is unreachable, the abort is retried
        in the background until it lands. ``reason`` is kept as the stop's detail (cut at
        MAX_REASON characters); a reason that is not a string raises TypeError before
        anything changes."""
        check_type("reason", reason, str)
        self._state.abort(reason[:MAX_REASON])
        self._state.send_abort()

    def record_event(self, event: SafetyEvent) -> None:
        """Append an event to this chain's event log (written with the next round trip)."""
        self._state.record_event(event)

    def propagate_child_cost(self, cost_usd: float) -> None:
        """Charge a cost spent outside a wrapped call to this context and every ancestor
        at once, like a settle (see :func:`~coordinator.context.charging.propagate_child_cost`)."""
        propagate_child_cost(self._state, cost_usd)

    def _propagate_child_cost(self, cost_usd: float, _visited: object = None) -> None:
        """The linking specification's name for :meth:`propagate_child_cost`."""
        propagate_child_cost(self._state, cost_usd)

    # -- wrapping ------------------------------------------------------------------------

    def wrap_llm_call(self, fn: Callable[[], Any], options: WrapOptions | None = None
                      ) -> Decision:
        """Run ``fn`` under the tree's limits: reserve its estimate at every level, call it,
        settle what it spent. Returns ALLOW, or HALT/RETRY/DEGRADE without (or after a
        failed) call. Never raises for a limit."""
        return run_sync(self._state, self, "llm", fn, options).decision

    def wrap_tool_call(self, fn: Callable[[], Any], options: WrapOptions | None = None
                       ) -> Decision:
        """Like :meth:`wrap_llm_call` for a tool (``before_tool_call`` hooks)."""
        return run_sync(self._state, self, "tool", fn, options).decision

    # -- egress --------------------------------------------------------------------------

    def check_egress(self, url: str) -> Decision:
        """Ask the pipeline's ``before_egress`` hooks whether data may be sent to ``url``
        (call it from a tool before it posts). ALLOW without a pipeline; a refusal's event
        goes to the chain's event log. TypeError when ``url`` is not a string."""
        check_type("url", url, str)
        pipeline = self.pipeline
        if pipeline is None:
            return Decision.ALLOW
        call = active_call.get()
        tool_ctx = call.tool_ctx if call is not None and call.owner is self else None
        if tool_ctx is None:
            m = self.metadata
            tool_ctx = ToolCallContext(
                request_id=m.request_id, chain_id=self.chain_id, node_id=uuid.uuid4().hex,
                kind="tool", model=m.model, org_id=m.org_id, team=m.team, service=m.service,
                user_id=m.user_id, tags=dict(m.tags))
        decision = pipeline.before_egress(tool_ctx, url)
        self._state.mirror_pipeline_events(pipeline)
        return decision

    # -- snapshots -----------------------------------------------------------------------

    def get_snapshot(self) -> ContextSnapshot:
        """The context's current state, read from Redis (after this process's queued
        writes). When Redis is unreachable, the last snapshot read (with the events
        recorded and a stop seen here since) is returned. In lease mode, the calls
        served from this handle's slice are written first."""
        flush_lease(self._state)
        return snapshot(self._state)

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={len(self.path) - 1})"
