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
import itertools
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..core.amounts import ms_to_datetime
from ..core.paths import Path
from ..core.plans import child_plan, open_plan
from ..data import chain as data_chain
from ..data import checkpoints
from ..data.context_data import ContextData
from ..data.lifecycle import check_step_name, init_child, parallel_children
from ..data.model import IsolationLevel, MergePolicy, MergeResult
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
from ..models_limits import LimitsChange
from ..models_records import BudgetWarning, CallInfo
from ..runtime.coordinator import Coordinator
from ..shield.pipeline import ShieldPipeline
from .budget_warnings import on_warning
from .call import active_call
from .cancellation import CancellationToken
from .charging import propagate_child_cost
from .closing import close_context, detach_context
from .edge import finishing
from .egress import check_egress
from .evaluating import result_or_raise, tightens
from .lease_registry import flush_lease
from .ledger import TokenLedger
from .opening import attach_state, check_type, mint_token, open_pending, open_state, token_state
from .reading import active_limits, load_snapshot, snapshot
from .state import ContextState
from .wrap import run_async, run_sync

if TYPE_CHECKING:
    from typing_extensions import Self

MAX_REASON = 1000
"""The longest abort reason kept (the rest is cut)."""

D = TypeVar("D", bound="ExecutionContext")

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


def current_call() -> CallInfo | None:
    """The wrapped call running here (its model: what its model ladder chose), or None
    outside any wrapped call."""
    call = active_call.get()
    if call is None:
        return None
    return CallInfo(call_id=call.call_id, kind=call.kind, model=call.model,
                    requested_model=call.options.model,
                    degraded=call.degraded_from is not None, final=call.final)


def current_cancellation_token() -> CancellationToken | None:
    """The token of the wrapped call running here (set on abort, timeout, or the call's own
    timeout); synchronous functions poll it."""
    call = active_call.get()
    if call is not None:
        return call.token
    ctx = active_context.get()
    return ctx.cancellation_token if ctx is not None else None


class ExecutionContext:
    """Containment for one chain (agent run) that bounds its whole subtree.

    ``with ExecutionContext(config) as ctx`` opens the context in Redis and closes it on
    exit; ``ExecutionContext.attach(token)`` joins an existing one from any process.
    A handle holds one :class:`~coordinator.context.state.ContextState`; each member
    hands it to the module that does the work (``opening``, ``closing``, ``wrap``,
    ``evaluating``, ``reading``, ``charging``, ``egress``, ``ledger`` and ``data/``;
    docs/architecture.md maps them). Async twins run the blocking part off the event
    loop or the call through the async driver (docs/async.md).
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
    async def aattach(cls, token: str, coordinator: Coordinator | None = None
                      ) -> Self:
        """Async twin of :meth:`attach`: reads the context off the event loop."""
        return cast("Self", await asyncio.to_thread(cls.attach, token, coordinator))

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

    async def aspawn_child(self, *args: Any, **kwargs: Any) -> Self:
        """Async twin of :meth:`spawn_child` (same arguments): opens off the event loop."""
        return cast("Self", await asyncio.to_thread(self.spawn_child, *args, **kwargs))

    # -- ids and settings ----------------------------------------------------------------

    @property
    def chain_id(self) -> str:
        return self._state.ctx_id

    @property
    def root_id(self) -> str:
        return self._state.path.root

    @property
    def path(self) -> tuple[str, ...]:
        """Context ids from the root down to this one."""
        return self._state.path.ids

    @property
    def _path(self) -> Path:
        return self._state.path

    @property
    def config(self) -> ExecutionConfig:
        """The effective limits (as the open reported them)."""
        return self._state.config

    @property
    def metadata(self) -> ChainMetadata:
        return self._state.metadata

    @property
    def pipeline(self) -> ShieldPipeline | None:
        return self._state.pipeline

    @pipeline.setter
    def pipeline(self, pipeline: ShieldPipeline | None) -> None:
        self._state.pipeline = pipeline

    @property
    def circuit_breaker(self) -> Any | None:
        return self._state.circuit_breaker

    @circuit_breaker.setter
    def circuit_breaker(self, breaker: Any | None) -> None:
        self._state.circuit_breaker = breaker

    @property
    def cancellation_token(self) -> CancellationToken:
        """Set when this context (or one above it) is aborted or times out."""
        return self._state.cancellation_token

    @property
    def token(self) -> str:
        """A signed string naming this context, for another process to :meth:`attach`.
        It expires at the context's deadline, or after a day."""
        return mint_token(self._state)

    def enable_call_keys(self) -> None:
        """Give this handle's calls replayable ids, ``<chain_id>:<n>`` with n counting from
        0. Work replayed in a new handle of the same context (a task redelivered after its
        worker died) is then recognised call by call: a call that already finished is not
        run or charged again (``wrap_*`` returns ALLOW, RETRY or HALT as it ended, HALT
        for one that raised, and ``evaluate`` returns None), and a call that was in
        flight is settled once.
        The replayed work must make its calls in the same order."""
        self._state.call_seq = itertools.count()

    @property
    def stop_reason(self) -> str | None:
        """Why this context (or one above it) is stopped, as far as this process knows
        (set at open, by a halted call, or by a broadcast stop); None while running."""
        return self._state.stopped

    @property
    def deadline(self) -> datetime | None:
        """The effective deadline (the earliest of this context's and its ancestors')."""
        return ms_to_datetime(self._state.deadline_ms)

    # -- with / async with ---------------------------------------------------------------

    def __enter__(self) -> ExecutionContext:
        self._ctx_token = active_context.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._leave()
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
        self._leave()
        await self.aclose()

    def _leave(self) -> None:
        """Stop being the context running here (the one ``__enter__`` set)."""
        if self._ctx_token is not None:
            try:
                active_context.reset(self._ctx_token)
            except ValueError:  # exited in another context (e.g. another task)
                active_context.set(None)
            self._ctx_token = None

    def close(self) -> None:
        """Flush this process's queued writes and, if this handle opened the context,
        close it in Redis (later calls in it and below it halt; keys expire after the
        coordinator's retention). Idempotent."""
        close_context(self._state)

    async def aclose(self) -> None:
        """Async twin of :meth:`close`: flushes and closes off the event loop."""
        await asyncio.to_thread(self.close)

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
        self._stop_here(reason)
        self._state.send_abort()

    async def aabort(self, reason: str) -> None:
        """Async twin of :meth:`abort`: work here is cancelled at once; the durable abort
        is written off the event loop."""
        self._stop_here(reason)
        await asyncio.to_thread(self._state.send_abort)

    def _stop_here(self, reason: str) -> None:
        check_type("reason", reason, str)
        self._state.abort(reason[:MAX_REASON])

    def set_limits(self, *, max_cost_usd: float | None = None, max_steps: int | None = None,
                   max_retries_total: int | None = None,
                   token_budget: TokenBudget | None = None, actor: str | None = None,
                   reason: str | None = None) -> LimitsChange:
        """Change this context's limits in Redis, audited, for every process: see
        :meth:`Coordinator.set_limits` (docs/operators.md). ``config`` keeps the limits the
        open reported; :meth:`get_snapshot` reads the new ones."""
        return self._state.coord.set_limits(
            self.chain_id, max_cost_usd=max_cost_usd, max_steps=max_steps,
            max_retries_total=max_retries_total, token_budget=token_budget, actor=actor,
            reason=reason)

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

    async def awrap_llm_call(self, fn: Callable[[], Awaitable[Any]],
                             options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_llm_call`: ``fn`` is a coroutine function, cancelled
        when the context is aborted or times out anywhere."""
        return (await run_async(self._state, self, "llm", fn, options)).decision

    async def awrap_tool_call(self, fn: Callable[[], Awaitable[Any]],
                              options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_tool_call`."""
        return (await run_async(self._state, self, "tool", fn, options)).decision

    def evaluate(self, fn: Callable[[], Any], options: WrapOptions | None = None, *,
                 deadline: datetime | None = None,
                 token_budget: TokenBudget | None = None) -> Any:
        """The exception-style twin of :meth:`wrap_llm_call`: returns ``fn``'s result, or
        raises :class:`~coordinator.errors.PromptEvaluationError` with ``phase`` set to
        ``preflight`` (invalid limits), ``deadline``, ``token_budget``, or ``halted`` (with
        the stop reason) for every other stop. A failure of ``fn`` itself is re-raised.
        ``deadline`` and ``token_budget`` tighten this context's limits for this call and
        everything it spawns (the call runs in a child context that carries them)."""
        target = self._tightened(deadline, token_budget)
        try:
            outcome = run_sync(target._state, target, "llm", fn, options)
        finally:
            if target is not self:
                target.close()
        return result_or_raise(target._state, outcome)

    async def aevaluate(self, fn: Callable[[], Awaitable[Any]],
                        options: WrapOptions | None = None, *,
                        deadline: datetime | None = None,
                        token_budget: TokenBudget | None = None) -> Any:
        """Async twin of :meth:`evaluate`."""
        target = self
        if deadline is not None or token_budget is not None:
            target = await asyncio.to_thread(self._tightened, deadline, token_budget)
        try:
            outcome = await run_async(target._state, target, "llm", fn, options)
        finally:
            if target is not self:
                await target.aclose()
        if outcome.decision == Decision.ALLOW:
            return outcome.result
        return await asyncio.to_thread(result_or_raise, target._state, outcome)

    def _tightened(self, deadline: datetime | None, token_budget: TokenBudget | None
                   ) -> ExecutionContext:
        """This context, or a child carrying ``evaluate``'s tighter limits."""
        if not tightens(deadline, token_budget):
            return self
        return self.spawn_child(deadline=deadline, token_budget=token_budget)

    def check_egress(self, url: str) -> Decision:
        """Ask the pipeline's ``before_egress`` hooks whether data may be sent to ``url``
        (call it from a tool before it posts). ALLOW without a pipeline; a refusal's event
        goes to the chain's event log. TypeError when ``url`` is not a string."""
        return check_egress(self._state, self, url)

    # -- snapshots, limits, ledger -------------------------------------------------------

    def get_snapshot(self) -> ContextSnapshot:
        """The context's current state, read from Redis (after this process's queued
        writes). When Redis is unreachable, the last snapshot read (with the events
        recorded and a stop seen here since) is returned. In lease mode, the calls
        served from this handle's slice are written first."""
        flush_lease(self._state)
        return snapshot(self._state)

    async def aget_snapshot(self) -> ContextSnapshot:
        """Async twin of :meth:`get_snapshot`: reads off the event loop."""
        return await asyncio.to_thread(self.get_snapshot)

    def limits(self) -> ActiveLimits:
        """The limits in force here: the tightest over this context and its ancestors."""
        flush_lease(self._state)
        return active_limits(self._state)

    def finishing(self) -> AbstractContextManager[None]:
        """``with ctx.finishing():`` marks every call of this context (and of its
        descendants) in the block final: they may spend ``final_reserve_usd``, as
        ``WrapOptions(final=True)`` does (docs/degrade.md)."""
        return finishing(self._state.ctx_id)

    def on_warning(self, callback: Callable[[BudgetWarning], object]) -> None:
        """Call ``callback`` with a :class:`~coordinator.BudgetWarning` when this context
        or an ancestor reaches one of its ``warn_at`` thresholds, whichever process spent
        it there: once per level, dimension and threshold for this handle, on the stop
        listener's thread (keep it short)."""
        on_warning(self._state, callback)

    @property
    def ledger(self) -> TokenLedger:
        """This context's :class:`~coordinator.context.ledger.TokenLedger`."""
        return TokenLedger(self._state)

    # -- context data (docs/context-data.md) ---------------------------------------------

    @property
    def data(self) -> ContextData:
        """This context's data: reads follow its isolation level, writes are local."""
        state = self._state
        return ContextData(state.coord, state.path, lambda: state.closed)

    def merge_into_parent(self, policy: MergePolicy | str = MergePolicy.KEEP_EXISTING,
                          keys: list[str] | None = None) -> MergeResult:
        """Merge this context's data into its parent's (one atomic script)."""
        return self.data.merge_into_parent(policy, keys)

    def checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        """Record the data stack this context sees under ``checkpoint_id``."""
        return checkpoints.take_checkpoint(self._state.coord, self._state.path, checkpoint_id)

    def with_checkpointing(self: D, interval_ms: int, checkpoint_id: str | None = None) -> D:
        """Checkpoint every ``interval_ms`` (under ``<chain_id>:auto`` unless named)
        until closed. Returns this context."""
        name = checkpoint_id or f"{self._state.ctx_id}:auto"
        checkpoints.Checkpointer(self.data, name, interval_ms).start()
        return self

    def serialize(self) -> str:
        """The data stack this context sees, with each level's metadata, as JSON."""
        return checkpoints.serialize(self._state.coord, self._state.path)

    @classmethod
    def deserialize(cls: type[D], document: str | dict[str, Any], config: ExecutionConfig, *,
                    coordinator: Coordinator | None = None) -> D:
        """A new tree whose data is the serialized stack's (budgets start afresh)."""
        return checkpoints.restore(document, lambda: cls(config, coordinator=coordinator))

    @classmethod
    def resume(cls: type[D], checkpoint_id: str, config: ExecutionConfig, *,
               coordinator: Coordinator | None = None, root_id: str | None = None) -> D:
        """A new tree whose data is the checkpoint's (budgets start afresh)."""
        return checkpoints.resume(checkpoint_id, lambda c: cls(config, coordinator=c),
                                  coordinator=coordinator, root_id=root_id)

    def parallel(self: D, step_names: list[str], **limits: Any) -> list[D]:
        """One isolated child per step name, marked ``is_parallel``."""
        return parallel_children(cast("Callable[..., D]", self.spawn_child), step_names,
                                 **limits)

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={len(self.path) - 1})"
