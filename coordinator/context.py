"""ExecutionContext: chain-level containment whose state lives in Redis, so that one set
of limits holds for a whole tree of agents in any process on any machine."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

from . import pricing
from .cancellation import CancellationToken, CancelledByContext
from .coordinator import CANCELLING_REASONS, Coordinator
from .data import chain as data_chain
from .data import checkpoints as data_checkpoints
from .data.context_data import ContextData
from .data.lifecycle import check_step_name, init_child
from .data.lifecycle import parallel as parallel_children
from .data.model import IsolationLevel, MergePolicy, MergeResult
from .errors import (
    BackendUnavailableError,
    ContextExistsError,
    ContextNotFoundError,
    DeadlineExceededError,
    InvalidConfigError,
    InvalidCostError,
    InvalidUsageError,
    PromptEvaluationError,
    TokenBudgetExceededError,
    TokenMalformedError,
)
from .ledger import TokenLedger
from .limits import (
    actual_amounts,
    held_amount,
    micro_to_usd,
    ms_to_datetime,
    remaining_tokens,
    remaining_usd,
    reserve_amounts,
    usd_to_micro,
)
from .models import (
    ActiveLimits,
    ChainMetadata,
    ContextSnapshot,
    Decision,
    ExecutionConfig,
    SafetyEvent,
    TokenBudget,
    WrapOptions,
    validate_deadline,
)
from .pipeline import ShieldPipeline, ToolCallContext
from .plans import (
    PLACEHOLDER_CONFIG,
    OpenPlan,
    child_plan,
    open_plan,
    placeholder_metadata,
)
from .policy import PolicyContext
from .snapshots import build_snapshot, config_from_hash
from .store import UNAVAILABLE, Held, Path, Replayed
from .usage import Usage, UsageCollector, reset_collector, set_collector, usage_from_response

log = logging.getLogger("coordinator")

HOOK = "ExecutionContext"
TOKEN_TTL_S = 24 * 3600
_NO_OPTIONS = WrapOptions()
# Errors raised by tool code that mean "a limit stops me" (the Limits specification).
_LIMIT_ERRORS: dict[type[Exception], str] = {
    DeadlineExceededError: "timeout",
    TokenBudgetExceededError: "token_budget_exceeded",
}
_REPLAYED = {"ok": Decision.ALLOW, "error": Decision.RETRY, "skip": Decision.HALT}
MAX_REASON = 1000
"""The longest abort reason kept (the rest is cut)."""

_current_context: ContextVar[ExecutionContext | None] = ContextVar("budget_ctx", default=None)
_current_call: ContextVar[_Call | None] = ContextVar("budget_call", default=None)


def current_context() -> ExecutionContext | None:
    """The context of the wrapped call (or ``with`` block) running here, if any."""
    call = _current_call.get()
    return call.ctx if call is not None else _current_context.get()


def current_limits() -> ActiveLimits | None:
    """The limits in force for the running code (deadline, remaining tokens and USD, the
    tightest over the whole path), or None outside any context. One Redis round trip."""
    ctx = current_context()
    return ctx.limits() if ctx is not None else None


def current_cancellation_token() -> CancellationToken | None:
    """The token of the wrapped call running here (set on abort, timeout, or the call's own
    timeout); synchronous functions poll it."""
    call = _current_call.get()
    if call is not None:
        return call.token
    ctx = _current_context.get()
    return ctx.cancellation_token if ctx is not None else None


@dataclass(frozen=True)
class _Outcome:
    """How one wrap ended: the decision, the function's result, and why it stopped."""

    decision: Decision
    result: Any = None
    reason: str | None = None
    detail: str = ""
    error: BaseException | None = None


@dataclass
class _Call:
    """One wrap call in flight."""

    ctx: ExecutionContext
    node_id: str
    kind: Literal["llm", "tool"]
    options: WrapOptions
    amounts: list[str | int]
    tool_ctx: ToolCallContext | None
    token: CancellationToken
    start_ts: float = field(default_factory=time.time)
    collector: UsageCollector = field(default_factory=UsageCollector)
    parent_node: str | None = None
    reserved: bool = True
    fn: Any = None  # the wrapped function (the causal chain digests a partial's arguments)
    held: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        """``held``: the reserved amounts by dimension."""
        a = self.amounts
        self.held = {str(a[i]): int(a[i + 1]) for i in range(0, len(a), 2)}


class ExecutionContext:
    """Containment for one chain (agent run) that bounds its whole subtree.

    ``with ExecutionContext(config) as ctx`` opens the context in Redis and closes it on
    exit; ``ExecutionContext.attach(token)`` joins an existing one from any process.
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
        _check_type("config", config, ExecutionConfig)
        if parent is not None:
            _check_type("parent", parent, ExecutionContext)
        coord = coordinator or (parent._coord if parent is not None else Coordinator.default())
        self._open(coord, open_plan(config, is_child=parent is not None), pipeline, metadata,
                   parent, circuit_breaker)

    def _open(
        self,
        coord: Coordinator,
        plan: OpenPlan,
        pipeline: ShieldPipeline | None,
        metadata: ChainMetadata | None,
        parent: ExecutionContext | None,
        circuit_breaker: Any | None,
    ) -> None:
        if pipeline is not None:
            _check_type("pipeline", pipeline, ShieldPipeline)
        if metadata is not None:
            _check_type("metadata", metadata, ChainMetadata)
        if metadata is None:
            base = parent.metadata if parent is not None else None
            chain_id = uuid.uuid4().hex
            metadata = (
                base.model_copy(update={"chain_id": chain_id})
                if base is not None
                else ChainMetadata(request_id=uuid.uuid4().hex, chain_id=chain_id)
            )
        path = (
            parent._path.child(metadata.chain_id)
            if parent is not None
            else Path(metadata.chain_id, (metadata.chain_id,))
        )
        self._init_handle(coord, path, plan.config, metadata, pipeline, circuit_breaker,
                          owner=True, parent=parent)
        self._open_args: tuple[OpenPlan, str] | None = (plan, metadata.model_dump_json())
        try:
            self._ensure_open(first=True)
        except UNAVAILABLE as exc:
            # Fail closed: the context exists locally; every wrap halts until Redis answers
            # and the open goes through.
            log.warning("could not open context %s: %s", path.ctx_id, exc)

    def _init_handle(
        self,
        coord: Coordinator,
        path: Path,
        config: ExecutionConfig,
        metadata: ChainMetadata,
        pipeline: ShieldPipeline | None,
        circuit_breaker: Any | None,
        *,
        owner: bool,
        parent: ExecutionContext | None,
    ) -> None:
        self._coord = coord
        self._store = coord.store
        self._path = path
        self.config = config
        self.metadata = metadata
        self.pipeline = pipeline
        self.circuit_breaker = circuit_breaker
        self.parent = parent
        self.cancellation_token = CancellationToken()
        self._owner = owner
        self._open_args = None
        self._stopped: str | None = None
        self._closed = False
        self._deadline_ms = 0
        self._mirrored = 0
        self._offline_events: list[SafetyEvent] = []
        self._last_snapshot: ContextSnapshot | None = None
        self._ctx_token: Any = None
        self._call_seq: itertools.count[int] | None = None

    def _ensure_open(self, *, first: bool = False) -> None:
        """Open the context in Redis if that has not happened yet (fails closed)."""
        args = self._open_args
        if args is None:
            return
        plan, meta_json = args
        opened = self._store.open(
            self._path, request_id=self.metadata.request_id, meta_json=meta_json,
            config_json=plan.config_json, timeout_ms=plan.config.timeout_ms,
            deadline_ms=plan.deadline_ms, triples=plan.triples)
        if isinstance(opened, str):
            kind, _, ancestor = opened.partition(":")
            if kind == "missing":
                raise ContextNotFoundError(ancestor)
            if kind == "bad_path":
                raise TokenMalformedError(f"{ancestor} is not at that place in the tree")
            if first:
                raise ContextExistsError(self._path.ctx_id)
            # A retried open whose first attempt went through before the connection broke.
            h = self._store.read_hash(self._path.root, self._path.ctx_id)
            opened_deadline = int(h.get("deadline") or 0)
        else:
            opened_deadline = opened.deadline_ms
            self._coord.observe_redis_time(opened.created_ms)
            self._apply_limits(opened.limits)
        self._open_args = None
        self._activate(opened_deadline)
        if not isinstance(opened, str) and opened.stop_reason:
            self._on_stop(opened.stop_reason)

    def _apply_limits(self, limits: dict[str, int]) -> None:
        """Make ``config`` state the effective limits the open reported (a root's are
        those it asked for: no copy then)."""
        effective: dict[str, Any] = {}
        if "usd" in limits:
            effective["max_cost_usd"] = micro_to_usd(limits["usd"])
        if "steps" in limits:
            effective["max_steps"] = limits["steps"]
        if "retries" in limits:
            effective["max_retries_total"] = limits["retries"]
        update = {k: v for k, v in effective.items() if getattr(self.config, k) != v}
        if update:
            self.config = self.config.model_copy(update=update)

    def _activate(self, deadline_ms: int) -> None:
        self._deadline_ms = deadline_ms
        self._coord.register(self)
        if deadline_ms:
            self._coord.call_at_redis_ms(deadline_ms, self._deadline_reached)

    @classmethod
    def attach(cls, token: str, coordinator: Coordinator | None = None) -> ExecutionContext:
        """A handle to the context a token names, from any process. Raises a
        :class:`~coordinator.errors.TokenError` for a bad token and
        :class:`~coordinator.errors.ContextNotFoundError` when the context is gone.
        Leaving a ``with`` block of an attached handle flushes it; it does not close the
        context (its owner does)."""
        coord = coordinator or Coordinator.default()
        claims = coord.codec.decode(token, now=coord.redis_now_ms() / 1000, tenant=coord.tenant)
        path = Path(claims.root, claims.path)
        try:
            return cls._handle_from_redis(coord, path)
        except UNAVAILABLE as exc:
            raise BackendUnavailableError("attach", exc) from exc

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
        coord = coordinator or Coordinator.default()
        claims = coord.codec.decode(token, now=coord.redis_now_ms() / 1000, tenant=coord.tenant)
        parent = cls.__new__(cls)
        parent._init_handle(coord, Path(claims.root, claims.path), PLACEHOLDER_CONFIG,
                            placeholder_metadata(claims.context),
                            None, None, owner=False, parent=None)
        return parent.spawn_child(**limits)

    @classmethod
    def _handle_from_redis(cls, coord: Coordinator, path: Path) -> ExecutionContext:
        h = coord.store.read_hash(path.root, path.ctx_id)
        if not h:
            raise ContextNotFoundError(path.ctx_id)
        if h.get("path") != ",".join(path.ids):
            # Defence in depth: a validly signed token whose ancestor path is not the one
            # recorded at open (a leaked key, a buggy issuer) could dodge a level's limits.
            raise TokenMalformedError("the token's ancestor path is not the context's")
        ctx = cls.__new__(cls)
        ctx._init_handle(coord, path, config_from_hash(h),
                         ChainMetadata(**json.loads(h["meta"])), None, None,
                         owner=False, parent=None)
        ctx._activate(int(h.get("deadline") or 0))
        if h.get("status") == "stopped":
            ctx._on_stop(h.get("reason") or "stopped")
        return ctx

    @classmethod
    def load_snapshot(cls, chain_id: str, coordinator: Coordinator | None = None
                      ) -> ContextSnapshot:
        """The current state of any context, from any process (including one stopped or
        closed: its state was persisted in Redis at every step)."""
        coord = coordinator or Coordinator.default()
        try:
            root = coord.store.locate(chain_id)
            h = coord.store.read_hash(root, chain_id) if root is not None else {}
            if root is None or not h:
                raise ContextNotFoundError(chain_id)
            path = Path(root, tuple(h["path"].split(",")))
            hashes, nodes, events, now = coord.store.read_state(path)
        except UNAVAILABLE as exc:
            raise BackendUnavailableError("load_snapshot", exc) from exc
        return build_snapshot(path, hashes, nodes, events, now, [])

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
    ) -> ExecutionContext:
        """Open a child context. Cost (and every token dimension) defaults to what remains
        above; steps and retries to the parent's limits. Explicit limits are tightened to
        what remains above; every ancestor's limits keep applying. ``isolation`` sets how
        the child reads its ancestors' data; a ``step_name`` makes it a step of the causal
        chain (coordinator/data)."""
        iso = IsolationLevel.of(isolation)
        check_step_name(step_name)
        plan = child_plan(self.config, max_cost_usd, max_steps, max_retries_total, timeout_ms,
                           token_budget, deadline)
        child = ExecutionContext.__new__(ExecutionContext)
        child._open(self._coord, plan, pipeline, metadata, self, self.circuit_breaker)
        init_child(child, self._coord, child._path, iso, step_name=step_name,
                   is_parallel=bool(is_parallel), metadata=child.metadata)
        return child

    # -- context data (coordinator/data: the CCOS execution-context specification) -------

    @property
    def data(self) -> ContextData:
        """This context's data: reads follow its isolation level, writes are local."""
        return ContextData(self._coord, self._path, lambda: self._closed)

    def merge_into_parent(self, policy: MergePolicy | str = MergePolicy.KEEP_EXISTING,
                          keys: list[str] | None = None) -> MergeResult:
        """Merge this context's data into its parent's (one atomic script)."""
        return self.data.merge_into_parent(policy, keys)

    def checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        """Record the data stack this context sees under ``checkpoint_id``."""
        return data_checkpoints.take_checkpoint(self._coord, self._path, checkpoint_id)

    def with_checkpointing(self, interval_ms: int, checkpoint_id: str | None = None
                           ) -> ExecutionContext:
        """Checkpoint every ``interval_ms`` (under ``<chain_id>:auto`` unless named)
        until closed. Returns this context."""
        data_checkpoints.Checkpointer(self.data, checkpoint_id or f"{self.chain_id}:auto",
                                      interval_ms).start()
        return self

    def serialize(self) -> str:
        """The data stack this context sees, with each level's metadata, as JSON."""
        return data_checkpoints.serialize(self._coord, self._path)

    @classmethod
    def deserialize(cls, document: str | dict[str, Any], config: ExecutionConfig, *,
                    coordinator: Coordinator | None = None) -> ExecutionContext:
        """A new tree whose data is the serialized stack's (budgets start afresh)."""
        return data_checkpoints.restore(document, config, coordinator=coordinator)

    @classmethod
    def resume(cls, checkpoint_id: str, config: ExecutionConfig, *,
               coordinator: Coordinator | None = None, root_id: str | None = None
               ) -> ExecutionContext:
        """A new tree whose data is the checkpoint's (budgets start afresh)."""
        return data_checkpoints.resume(checkpoint_id, config, coordinator=coordinator,
                                       root_id=root_id)

    def parallel(self, step_names: list[str], **limits: Any) -> list[ExecutionContext]:
        """One isolated child per step name, marked ``is_parallel``."""
        return parallel_children(self, step_names, **limits)

    # -- identity ------------------------------------------------------------------------

    @property
    def chain_id(self) -> str:
        return self._path.ctx_id

    @property
    def root_id(self) -> str:
        return self._path.root

    @property
    def path(self) -> tuple[str, ...]:
        """Context ids from the root down to this one."""
        return self._path.ids

    @property
    def token(self) -> str:
        """A signed string naming this context, for another process to :meth:`attach`.
        It expires at the context's deadline, or after a day."""
        now_s = self._coord.redis_now_ms() / 1000
        ttl = TOKEN_TTL_S
        if self._deadline_ms:
            ttl = max(1, min(ttl, int(self._deadline_ms / 1000 - now_s) + 1))
        return self._coord.codec.encode(root=self._path.root, path=self._path.ids,
                                        tenant=self._coord.tenant, ttl_s=ttl, now=now_s)

    def enable_call_keys(self) -> None:
        """Give this handle's calls replayable ids, ``<chain_id>:<n>`` with n counting from
        0. Work replayed in a new handle of the same context (a task redelivered after its
        worker died) is then recognised call by call: a call that already finished is not
        run or charged again (``wrap_*`` returns ALLOW, RETRY or HALT as it ended, and
        ``evaluate`` returns None), and a call that was in flight is settled once.
        The replayed work must make its calls in the same order."""
        self._call_seq = itertools.count()

    @property
    def stop_reason(self) -> str | None:
        """Why this context (or one above it) is stopped, as far as this process knows
        (set at open, by a halted call, or by a broadcast stop); None while running."""
        return self._stopped

    @property
    def deadline(self) -> datetime | None:
        """The effective deadline (the earliest of this context's and its ancestors')."""
        return ms_to_datetime(self._deadline_ms)

    # -- with / async with ---------------------------------------------------------------

    def __enter__(self) -> ExecutionContext:
        self._ctx_token = _current_context.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._ctx_token is not None:
            try:
                _current_context.reset(self._ctx_token)
            except ValueError:  # exited in another context (e.g. another task)
                _current_context.set(None)
            self._ctx_token = None
        if exc is not None:
            data_chain.step_failed(self, exc)
        self.close()

    async def __aenter__(self) -> ExecutionContext:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def close(self) -> None:
        """Flush this process's queued writes and, if this handle opened the context,
        close it in Redis (later calls in it and below it halt; keys expire after the
        coordinator's retention). Idempotent."""
        if self._closed:
            return
        data_chain.step_closed(self, self._coord, self._path, self.metadata)
        self._closed = True
        try:
            self._store.flush()
            if self._owner and self._open_args is None:
                m = self.metadata
                self._store.close(self._path, self._coord.retention_s,
                                  {"org": m.org_id, "team": m.team, "service": m.service})
        except UNAVAILABLE as exc:
            log.warning("closing %s: Redis unavailable (%s); queued writes stay queued and "
                        "open leases will charge their estimates", self.chain_id, exc)
        self._coord.unregister(self)

    def detach(self) -> None:
        """Let go of this handle without closing the context: flush this process's writes
        and start the retention clock on the context's keys, but leave it open for work
        still running under it elsewhere (sub-tasks sent by a task that has returned).
        Its tree's root closing still ends it. Idempotent; ``close`` after it is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._open_args is None:
                self._store.expire_context(self._path, self._coord.retention_s)
            else:
                self._store.flush()
        except UNAVAILABLE as exc:
            log.warning("detaching %s: Redis unavailable (%s); queued writes stay queued",
                        self.chain_id, exc)
        self._coord.unregister(self)

    # -- stops ---------------------------------------------------------------------------

    def _on_stop(self, reason: str) -> None:
        """This context or an ancestor was stopped (heard here or by pub/sub)."""
        self._stopped = reason
        if reason in CANCELLING_REASONS:
            self.cancellation_token.cancel(reason)

    def _deadline_reached(self) -> None:
        if self._closed:
            return
        try:
            res = self._store.abort(self._path, "timeout", "deadline reached")
        except UNAVAILABLE:
            res = [1]  # Redis will stop it itself at the next reserve (TIME > deadline)
        if res[0] == 2:  # early by our clock estimate: try again when Redis agrees
            self._coord.call_later(max(0.001, int(res[1]) / 1000), self._deadline_reached)
            return
        self._on_stop("timeout")

    def abort(self, reason: str) -> None:
        """Stop this context and its whole subtree, in every process, durably. Running
        work is cancelled through pub/sub. If Redis is unreachable, the abort is retried
        in the background until it lands. ``reason`` is kept as the stop's detail (cut at
        MAX_REASON characters); a reason that is not a string raises TypeError before
        anything changes."""
        _check_type("reason", reason, str)
        self._on_stop("aborted")
        self._send_abort(reason[:MAX_REASON])

    def _send_abort(self, reason: str) -> None:
        try:
            self._ensure_open()
            self._store.abort(self._path, "aborted", reason)
        except UNAVAILABLE as exc:
            log.warning("abort of %s not yet durable (%s); retrying", self.chain_id, exc)
            self._coord.call_later(0.5, lambda: self._send_abort(reason))

    # -- events --------------------------------------------------------------------------

    def record_event(self, event: SafetyEvent) -> None:
        """Append an event to this chain's event log (written with the next round trip)."""
        self._store.queue_event(self._path, event.model_dump_json())
        self._coord.schedule_flush()

    def _event(self, event_type: str, reason: str, decision: Decision = Decision.HALT,
               **metadata: Any) -> SafetyEvent:
        return SafetyEvent(event_type=event_type, decision=decision, reason=reason, hook=HOOK,
                           request_id=self.metadata.request_id,
                           metadata={"chain_id": self.chain_id, **metadata})

    def _mirror_pipeline_events(self, pipeline: ShieldPipeline) -> None:
        events = pipeline.get_events()
        for event in events[self._mirrored:]:
            self.record_event(event)
        self._mirrored = len(events)

    # -- wrapping ------------------------------------------------------------------------

    def wrap_llm_call(self, fn: Callable[[], Any], options: WrapOptions | None = None
                      ) -> Decision:
        """Run ``fn`` under the tree's limits: reserve its estimate at every level, call it,
        settle what it spent. Returns ALLOW, or HALT/RETRY/DEGRADE without (or after a
        failed) call. Never raises for a limit."""
        return self._wrap_sync("llm", fn, options).decision

    def wrap_tool_call(self, fn: Callable[[], Any], options: WrapOptions | None = None
                       ) -> Decision:
        """Like :meth:`wrap_llm_call` for a tool (``before_tool_call`` hooks)."""
        return self._wrap_sync("tool", fn, options).decision

    async def awrap_llm_call(self, fn: Callable[[], Awaitable[Any]],
                             options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_llm_call`: ``fn`` is a coroutine function, cancelled
        when the context is aborted or times out anywhere."""
        return (await self._wrap_async("llm", fn, options)).decision

    async def awrap_tool_call(self, fn: Callable[[], Awaitable[Any]],
                              options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_tool_call`."""
        return (await self._wrap_async("tool", fn, options)).decision

    def _wrap_sync(self, kind: Literal["llm", "tool"], fn: Callable[[], Any],
                   options: WrapOptions | None) -> _Outcome:
        opts = _checked_call(fn, options)
        attempts = 1 + (opts.retry_policy_override or 0)
        for attempt in range(attempts):
            call = self._begin(kind, opts)
            if isinstance(call, _Outcome):
                return call
            call.fn = fn
            vars_ = self._enter_call(call)
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - every outcome must settle
                outcome = self._fail(call, exc)
                if outcome is None:
                    raise
                if outcome.decision == Decision.RETRY and attempt + 1 < attempts:
                    continue
                return outcome
            finally:
                self._exit_call(call, vars_)
            return self._complete(call, result)
        raise AssertionError("unreachable")

    async def _wrap_async(self, kind: Literal["llm", "tool"],
                          fn: Callable[[], Awaitable[Any]],
                          options: WrapOptions | None) -> _Outcome:
        opts = _checked_call(fn, options)
        attempts = 1 + (opts.retry_policy_override or 0)
        loop = asyncio.get_running_loop()
        for attempt in range(attempts):
            call = self._begin(kind, opts)
            if isinstance(call, _Outcome):
                return call
            call.fn = fn
            vars_ = self._enter_call(call)
            try:
                task = loop.create_task(_as_coroutine(fn))
            finally:
                self._exit_call(call, vars_, detach=False)
            unhook = call.token.on_cancel(_canceller(loop, task))
            try:
                result = await task
            except BaseException as exc:  # noqa: BLE001 - every outcome must settle
                if isinstance(exc, asyncio.CancelledError) and call.token.cancelled:
                    exc = CancelledByContext(call.token.reason or "cancelled")
                outcome = self._fail(call, exc)
                if outcome is None:
                    raise
                if outcome.decision == Decision.RETRY and attempt + 1 < attempts:
                    continue
                return outcome
            finally:
                unhook()
                if call.token is not self.cancellation_token:
                    call.token.detach()
            return self._complete(call, result)
        raise AssertionError("unreachable")

    def _enter_call(self, call: _Call) -> tuple[Any, Any]:
        return _current_call.set(call), set_collector(call.collector)

    def _exit_call(self, call: _Call, vars_: tuple[Any, Any], *, detach: bool = True) -> None:
        reset_collector(vars_[1])
        _current_call.reset(vars_[0])
        if detach and call.token is not self.cancellation_token:
            call.token.detach()

    def _begin(self, kind: Literal["llm", "tool"], opts: WrapOptions) -> _Call | _Outcome:
        """Reserve, then consult the pipeline and the circuit breaker. Returns the call in
        flight, or the decision that stops it before it runs."""
        keyed = self._call_seq is not None
        node_id = (f"{self.chain_id}:{next(self._call_seq)}" if self._call_seq is not None
                   else secrets.token_hex(16))
        if self._stopped is not None:
            return self._halt(kind, opts, node_id, self._stopped,
                              f"context stopped: {self._stopped}")
        if self._closed:
            return self._halt(kind, opts, node_id, "closed", "context is closed")
        amounts = reserve_amounts(opts)
        try:
            self._ensure_open()
            res = self._store.reserve(self._path, node_id, amounts, keyed=keyed)
        except UNAVAILABLE as exc:
            if self._coord.fail_open:
                log.warning("Redis unavailable; running %s without a budget (fail_open)",
                            node_id)
                return self._new_call(kind, opts, node_id, amounts, reserved=False)
            err = BackendUnavailableError("reserve", exc)
            return self._halt(kind, opts, node_id, "backend_unavailable", str(err),
                              offline=True)
        if isinstance(res, Replayed):  # finished in an earlier delivery of the same work
            return _Outcome(_REPLAYED[res.outcome], reason="replayed",
                            detail=f"call {node_id} already finished ({res.outcome})")
        if not isinstance(res, Held):
            level_id = self._path.ids[res.level] if res.level >= 0 else self.chain_id
            if res.stopped:
                self._on_stop(res.reason)
            return self._halt(kind, opts, node_id, res.reason, res.detail, level=level_id)
        self._coord.observe_redis_time(res.now_ms)
        if res.expired:
            self._reap(res.expired)
        call = self._new_call(kind, opts, node_id, amounts)
        try:
            refusal = self._consult_before(call)
        except BaseException:  # a hook failed: the call never runs, its hold goes
            self._store.finish(self._path, node_id, outcome="skip",
                               node=self._node(call, "error"), amounts=[], write_behind=True)
            self._coord.schedule_flush()
            raise
        if refusal is not None:
            self._store.finish(self._path, node_id, outcome="skip",
                               node=self._node(call, "halted"), amounts=[],
                               write_behind=True)
            self._coord.schedule_flush()
            if call.token is not self.cancellation_token:
                call.token.detach()
            return refusal
        return call

    def _new_call(self, kind: Literal["llm", "tool"], opts: WrapOptions, node_id: str,
                  amounts: list[str | int], *, reserved: bool = True) -> _Call:
        parent_call = _current_call.get()
        tool_ctx = None
        if self.pipeline is not None or self.circuit_breaker is not None:
            m = self.metadata
            tool_ctx = ToolCallContext(
                request_id=m.request_id, chain_id=self.chain_id, node_id=node_id, kind=kind,
                operation_name=opts.operation_name, cost_estimate_usd=opts.cost_estimate_hint,
                provider=opts.provider, model=opts.model or m.model, org_id=m.org_id,
                team=m.team, service=m.service, user_id=m.user_id, tags=dict(m.tags),
            )
        # A call shares its context's token unless it has a timeout of its own.
        token = self.cancellation_token
        if opts.timeout_ms:
            token = CancellationToken(parent=self.cancellation_token)
            self._coord.call_later(opts.timeout_ms / 1000, lambda: token.cancel("timeout"))
        return _Call(self, node_id, kind, opts, amounts, tool_ctx, token,
                     parent_node=parent_call.node_id if parent_call else None,
                     reserved=reserved)

    def _consult_before(self, call: _Call) -> _Outcome | None:
        """Pipeline hooks, then the circuit breaker (the spec's order, after limits).
        Returns the refusal, or None to go ahead."""
        if self.pipeline is not None and call.tool_ctx is not None:
            hook = (self.pipeline.before_llm_call if call.kind == "llm"
                    else self.pipeline.before_tool_call)
            decision = hook(call.tool_ctx)
            self._mirror_pipeline_events(self.pipeline)
            if decision != Decision.ALLOW:
                return _Outcome(decision, reason="pipeline",
                                detail=f"a pipeline hook returned {decision.value}")
        if self.circuit_breaker is not None:
            verdict = self.circuit_breaker.check(PolicyContext(
                cost_usd=call.options.cost_estimate_hint, step_count=0))
            if not verdict.allowed:
                self.record_event(self._event("circuit_open", verdict.reason,
                                              node_id=call.node_id))
                return _Outcome(Decision.HALT, reason="circuit_open", detail=verdict.reason)
        return None

    def _halt(self, kind: Literal["llm", "tool"], opts: WrapOptions, node_id: str,
              reason: str, detail: str, *, offline: bool = False,
              level: str | None = None) -> _Outcome:
        """Record a refused call (event and node); the outcome is HALT."""
        meta: dict[str, Any] = {"node_id": node_id, "operation_name": opts.operation_name}
        if level is not None and level != self.chain_id:
            meta["stopped_at"] = level
        event = self._event(reason, detail or reason, **meta)
        outcome = _Outcome(Decision.HALT, reason=reason, detail=detail)
        if offline:
            self._offline_events.append(event)
            return outcome
        status = reason if reason in ("aborted", "timeout") else "halted"
        now = time.time()
        node = {"node_id": node_id, "kind": kind, "operation_name": opts.operation_name,
                "start_ts": now, "end_ts": now, "status": status}
        self._store.queue_event(self._path, event.model_dump_json())
        self._store.queue_node(self._path, json.dumps(node))
        self._coord.schedule_flush()
        return outcome

    def _reap(self, expired: list[tuple[str, dict[str, Any]]]) -> None:
        """Settle reservations whose worker stopped renewing them, at their estimate."""
        now = time.time()
        for res_id, rec in expired:
            held = rec["d"]
            node = {"node_id": res_id, "kind": "llm", "operation_name": "(lease expired)",
                    "start_ts": now, "end_ts": now, "status": "lost",
                    "cost_usd": micro_to_usd(held_amount(held, "usd")),
                    "input_tokens": held_amount(held, "tin"),
                    "output_tokens": held_amount(held, "tout")}
            self._store.reap(self._path.root, res_id, rec, node)
        self._coord.schedule_flush()

    def _node(self, call: _Call, status: str, *, cost_micro: int = 0, tin: int = 0,
              tout: int = 0, retries: int = 0, usage: Usage | None = None) -> dict[str, Any]:
        return {
            "node_id": call.node_id, "parent_id": call.parent_node, "kind": call.kind,
            "operation_name": call.options.operation_name, "start_ts": call.start_ts,
            "end_ts": time.time(), "status": status, "cost_usd": micro_to_usd(cost_micro),
            "retries_used": retries, "input_tokens": tin, "output_tokens": tout,
            "provider": (usage.provider if usage else None) or call.options.provider,
            "model": (usage.model if usage else None) or call.options.model,
        }

    def _spent(self, call: _Call, usage: Usage | None, *, default_to_estimate: bool
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

    def _complete(self, call: _Call, result: Any) -> _Outcome:
        if call.kind == "tool":
            data_chain.capability_called(self._coord, self._path, self.metadata,
                                         operation=call.options.operation_name,
                                         node_id=call.node_id, fn=call.fn, result=result)
        try:
            usage = call.collector.usage or usage_from_response(result)
            cost, tin, tout, provider = self._spent(call, usage, default_to_estimate=True)
        except Exception as exc:  # noqa: BLE001 - the response's usage cannot be taken
            self._charge_estimate(call)
            raise InvalidUsageError(f"call {call.node_id} ran, but its usage cannot be "
                                    f"charged ({exc}); its estimate was charged") from exc
        decision = Decision.ALLOW
        try:
            if self.pipeline is not None and call.tool_ctx is not None:
                decision = self.pipeline.before_charge(call.tool_ctx, micro_to_usd(cost))
                self._mirror_pipeline_events(self.pipeline)
            if self.circuit_breaker is not None:
                self.circuit_breaker.record_success()
        finally:  # the money is spent whatever a hook does
            if call.reserved:
                amounts = actual_amounts(cost, tin, tout, provider)
                held = call.held
                within = all(int(amounts[i + 1]) <= held.get(str(amounts[i]), 0)
                             for i in range(0, len(amounts), 2))
                node = self._node(call, "ok", cost_micro=cost, tin=tin, tout=tout,
                                  usage=usage)
                self._finish(call, "ok", node, amounts, write_behind=within)
        return _Outcome(decision, result)

    def _charge_estimate(self, call: _Call) -> None:
        """Settle a call that ran but whose usage cannot be read or priced at its estimate
        (it was billed, for an unknown amount); it counts no step and no retry."""
        cost, tin, tout, provider = self._spent(call, None, default_to_estimate=True)
        node = self._node(call, "error", cost_micro=cost, tin=tin, tout=tout)
        self._finish(call, "skip", node, actual_amounts(cost, tin, tout, provider),
                     write_behind=True)

    def _fail(self, call: _Call, exc: BaseException) -> _Outcome | None:
        """Settle a call that did not complete. Returns the outcome, or None to re-raise
        (interpreter exits, outer cancellations, bad usage reports)."""
        if call.kind == "tool":
            data_chain.capability_called(self._coord, self._path, self.metadata,
                                         operation=call.options.operation_name,
                                         node_id=call.node_id, fn=call.fn, error=exc)
        usage = call.collector.usage
        if self.circuit_breaker is not None and (
            isinstance(exc, (CancelledByContext, *_LIMIT_ERRORS)) or not isinstance(exc, Exception)
        ):
            self.circuit_breaker.release()  # not a provider failure: free a probe it held
        if isinstance(exc, CancelledByContext):
            reason = exc.reason if exc.reason in ("aborted", "timeout") else "aborted"
            # Work was in flight when it was cancelled: charge what it reported, else its
            # estimate (it may have been billed).
            cost, tin, tout, provider = self._spent(call, usage, default_to_estimate=True)
            node = self._node(call, reason, cost_micro=cost, tin=tin, tout=tout, usage=usage)
            self._finish(call, "skip", node, actual_amounts(cost, tin, tout, provider),
                         write_behind=False)
            if not self.cancellation_token.cancelled:  # the call's own timeout
                self.record_event(self._event("timeout", f"call exceeded "
                                              f"{call.options.timeout_ms} ms",
                                              node_id=call.node_id, scope="call"))
            return _Outcome(Decision.HALT, reason=reason, error=exc)
        cost, tin, tout, provider = self._spent(call, usage, default_to_estimate=False)
        amounts = actual_amounts(cost, tin, tout, provider)
        if not isinstance(exc, Exception) or isinstance(exc, (InvalidCostError,
                                                            InvalidUsageError)):
            # Interpreter exits, outer cancellations and bad usage reports propagate; the
            # call counts no retry, and what it validly reported is still charged.
            node = self._node(call, "error", cost_micro=cost, tin=tin, tout=tout, usage=usage)
            self._finish(call, "skip", node, amounts, write_behind=True)
            return None
        limit_error = next((r for t, r in _LIMIT_ERRORS.items() if isinstance(exc, t)), None)
        if limit_error is not None:
            # A tool gave up on a limit (Limits specification): no retry is counted.
            reason = limit_error
            node = self._node(call, "timeout" if reason == "timeout" else "halted",
                              cost_micro=cost, tin=tin, tout=tout, usage=usage)
            self._finish(call, "skip", node, amounts, write_behind=False)
            self.record_event(self._event(reason, f"{type(exc).__name__}: {exc}",
                                          node_id=call.node_id, scope="tool"))
            return _Outcome(Decision.HALT, reason=reason, detail=str(exc), error=exc)
        decision = Decision.RETRY
        if self.pipeline is not None and call.tool_ctx is not None:
            decision = self.pipeline.on_error(call.tool_ctx, exc)
            self._mirror_pipeline_events(self.pipeline)
        if self.circuit_breaker is not None:
            self.circuit_breaker.record_failure()
        node = self._node(call, "error", cost_micro=cost, tin=tin, tout=tout, retries=1,
                          usage=usage)
        stops = self._finish(call, "error", node, amounts, write_behind=False)
        if any(s.reason == "retry_budget_exceeded" for s in stops) or (
            self._stopped == "retry_budget_exceeded"
        ):
            self.record_event(self._event(
                "provider_error",
                f"{type(exc).__name__}: {exc} (retry budget exhausted)",
                node_id=call.node_id))
            return _Outcome(Decision.HALT, reason="provider_error", detail=str(exc), error=exc)
        return _Outcome(decision, reason=None if decision == Decision.RETRY else "pipeline",
                        error=exc)

    def _finish(self, call: _Call, outcome: str, node: dict[str, Any],
                amounts: list[str | int], *, write_behind: bool) -> list[Any]:
        if not call.reserved:
            return []
        try:
            stops = self._store.finish(self._path, call.node_id, outcome=outcome, node=node,
                                       amounts=amounts, write_behind=write_behind)
        except UNAVAILABLE:
            # Keep it queued; if it never lands, the lease charges the estimate.
            stops = self._store.finish(self._path, call.node_id, outcome=outcome, node=node,
                                       amounts=amounts, write_behind=True)
        if write_behind:
            self._coord.schedule_flush()
        for stop in stops:
            if stop.ctx_id in self._path.ids:
                self._on_stop(stop.reason)
        return stops

    # -- egress --------------------------------------------------------------------------

    def check_egress(self, url: str) -> Decision:
        """Ask the pipeline's ``before_egress`` hooks whether data may be sent to ``url``
        (call it from a tool before it posts). ALLOW without a pipeline; a refusal's event
        goes to the chain's event log. TypeError when ``url`` is not a string."""
        _check_type("url", url, str)
        if self.pipeline is None:
            return Decision.ALLOW
        call = _current_call.get()
        tool_ctx = call.tool_ctx if call is not None and call.ctx is self else None
        if tool_ctx is None:
            m = self.metadata
            tool_ctx = ToolCallContext(
                request_id=m.request_id, chain_id=self.chain_id, node_id=uuid.uuid4().hex,
                kind="tool", model=m.model, org_id=m.org_id, team=m.team, service=m.service,
                user_id=m.user_id, tags=dict(m.tags))
        decision = self.pipeline.before_egress(tool_ctx, url)
        self._mirror_pipeline_events(self.pipeline)
        return decision

    # -- the Limits specification: evaluate, limits, ledger ---------------------------

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
            outcome = target._wrap_sync("llm", fn, options)
        finally:
            if target is not self:
                target.close()
        return target._result_or_raise(outcome)

    async def aevaluate(self, fn: Callable[[], Awaitable[Any]],
                        options: WrapOptions | None = None, *,
                        deadline: datetime | None = None,
                        token_budget: TokenBudget | None = None) -> Any:
        """Async twin of :meth:`evaluate`."""
        target = self._tightened(deadline, token_budget)
        try:
            outcome = await target._wrap_async("llm", fn, options)
        finally:
            if target is not self:
                target.close()
        return target._result_or_raise(outcome)

    def _tightened(self, deadline: datetime | None, token_budget: TokenBudget | None
                   ) -> ExecutionContext:
        if deadline is None and token_budget is None:
            return self
        try:
            validate_deadline(deadline)
        except ValueError as exc:
            raise InvalidConfigError("evaluate", [
                {"loc": ("deadline",), "msg": str(exc), "input": deadline}]) from None
        return self.spawn_child(deadline=deadline, token_budget=token_budget)

    def _result_or_raise(self, outcome: _Outcome) -> Any:
        if outcome.decision == Decision.ALLOW:
            return outcome.result
        if outcome.decision == Decision.RETRY and outcome.error is not None:
            raise outcome.error
        reason = outcome.reason or outcome.decision.value
        raise self._limit_error(reason, outcome.detail) from outcome.error

    def _limit_error(self, reason: str, detail: str) -> PromptEvaluationError:
        phase = {"timeout": "deadline", "token_budget_exceeded": "token_budget"}.get(
            reason, "halted")
        try:
            payload = self.limits().model_dump(mode="json")
        except UNAVAILABLE:
            payload = {"deadline": self.deadline.isoformat() if self.deadline else None}
        return PromptEvaluationError(f"{reason}: {detail}" if detail else reason,
                                     phase=phase, reason=reason, provider_payload=payload)

    def limits(self) -> ActiveLimits:
        """The limits in force here: the tightest over this context and its ancestors."""
        hashes, _, _, now = self._store.read_state(self._path, nodes=False, events=False)
        deadline_ms = int(hashes[-1].get("deadline") or 0)
        return ActiveLimits(
            deadline=ms_to_datetime(deadline_ms),
            time_remaining_ms=float(max(0, deadline_ms - now)) if deadline_ms else None,
            cost_usd_remaining=remaining_usd(hashes),
            tokens_remaining=remaining_tokens(hashes),
        )

    @property
    def ledger(self) -> TokenLedger:
        """This context's :class:`~coordinator.ledger.TokenLedger`."""
        return TokenLedger(self)

    def _finish_reservation(self, reservation_id: str, amounts: list[str | int]) -> None:
        self._store.finish(self._path, reservation_id, outcome="skip", node=None,
                           amounts=amounts, write_behind=False)

    # -- snapshots -----------------------------------------------------------------------

    def get_snapshot(self) -> ContextSnapshot:
        """The context's current state, read from Redis (after this process's queued
        writes). When Redis is unreachable, the last snapshot read (with the events
        recorded since) is returned."""
        try:
            self._ensure_open()
            hashes, nodes, events, now = self._store.read_state(self._path)
        except UNAVAILABLE:
            return self._offline_snapshot()
        snap = build_snapshot(self._path, hashes, nodes, events, now, self._offline_events)
        self._last_snapshot = snap
        return snap

    def _offline_snapshot(self) -> ContextSnapshot:
        last = self._last_snapshot
        events = [*(last.events if last else []), *self._offline_events]
        if last is not None:
            return last.model_copy(update={"events": events})
        return ContextSnapshot(
            chain_id=self.chain_id, request_id=self.metadata.request_id, step_count=0,
            cost_usd_accumulated=0.0, retries_used=0, aborted=self._stopped is not None,
            abort_reason=self._stopped, elapsed_ms=0.0, nodes=[], events=events,
            parent_chain_id=self._path.parent_id, root_chain_id=self._path.root,
            metadata=self.metadata,
        )

    def __repr__(self) -> str:
        return f"ExecutionContext(chain_id={self.chain_id!r}, depth={len(self._path.ids) - 1})"


def _check_type(name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}; got {value!r}")


def _checked_call(fn: object, options: object) -> WrapOptions:
    """The options of a wrap call, once its arguments are known to be right (before
    anything is reserved): raises TypeError otherwise."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments; got {fn!r}")
    if options is None:
        return _NO_OPTIONS
    if not isinstance(options, WrapOptions):
        raise TypeError(f"options must be a WrapOptions; got {options!r}")
    return options


async def _as_coroutine(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


def _canceller(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]
               ) -> Callable[[str], None]:
    """A token callback (run on any thread) that cancels ``task`` on its loop."""
    def cancel(_reason: str) -> None:
        loop.call_soon_threadsafe(task.cancel)
    return cancel
