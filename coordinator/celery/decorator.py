"""``@contained``: run a Celery task inside an ExecutionContext.

With a ``budget_context`` token in its message the task runs in a new child of that
context; without one it opens a root context. Its limits are the decorator's (a child's
are tightened by what remains above). The body never runs when the context is already
stopped, and is interrupted when the context is aborted or times out while it runs.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from celery import signals
from celery._state import get_current_task

from coordinator.context import tracing
from coordinator.context.cancellation import CancelledByContext
from coordinator.context.execution import ExecutionContext
from coordinator.core.vocabulary import StopReason
from coordinator.data.model import IsolationLevel
from coordinator.errors import ContextExistsError, ContextNotFoundError
from coordinator.models import MAX_LABEL, ChainMetadata, ExecutionConfig, TokenBudget
from coordinator.runtime.coordinator import Coordinator
from coordinator.store.errors import RedisError

from . import running
from .errors import NoContextHeaderError, TaskStoppedError
from .interrupt import Armed
from .propagation import incoming_token, incoming_trace, sent_tasks

log = logging.getLogger("coordinator.celery")

F = TypeVar("F", bound=Callable[..., Any])


def contained(
    max_cost_usd: float | None = None,
    max_steps: int | None = None,
    max_retries_total: int | None = None,
    timeout_ms: int = 0,
    *,
    token_budget: TokenBudget | None = None,
    team: str = "",
    org_id: str = "",
    interrupt: bool = True,
    coordinator: Coordinator | None = None,
    isolation: IsolationLevel | str = IsolationLevel.INHERIT,
) -> Callable[[F], F]:
    """Make a Celery task run in an ExecutionContext. Put it *under* the task decorator::

        @app.task(bind=True)
        @contained(max_cost_usd=0.50)
        def research(self, topic): ...

    Called with a token in the message (a task sent while a context was current), the
    task runs in a child of that context: limits left ``None`` inherit what remains above.
    Called without one, it opens a root context, which needs ``max_cost_usd``,
    ``max_steps`` and ``max_retries_total`` (a :class:`NoContextHeaderError` fails the
    task otherwise). Inside the body ``current_context()`` is the context.

    When the context is aborted or times out while the body runs, the body is
    interrupted with :class:`TaskInterrupted` (``interrupt=False``: it is only told,
    through ``current_cancellation_token()``, for bodies that stop cooperatively).

    ``isolation`` is the child's context-data isolation level (``"isolated"`` for the
    members of a ``group`` whose chord callback merges them: docs/context-data.md).
    """
    iso = IsolationLevel.of(isolation)
    # Validate what was given now, at import time, not when the first task runs. A root's
    # config is the same for every run: built once (None: without all three limits a
    # root cannot open).
    root_config: ExecutionConfig | None = None
    if max_cost_usd is not None and max_steps is not None and max_retries_total is not None:
        root_config = ExecutionConfig(max_cost_usd=max_cost_usd, max_steps=max_steps,
                                      max_retries_total=max_retries_total,
                                      timeout_ms=timeout_ms, token_budget=token_budget)
    else:
        ExecutionConfig(max_cost_usd=max_cost_usd or 1.0, max_steps=max_steps or 1,
                        max_retries_total=max_retries_total or 1, timeout_ms=timeout_ms,
                        token_budget=token_budget)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            task = get_current_task()
            # called as a plain function, or as ``task()``: no message, no task id
            if task is None or task.request.called_directly:
                raise RuntimeError(f"{fn.__name__} is a @contained Celery task; call it "
                                   f"through Celery (delay, apply_async, apply)")
            request = task.request
            task_id = str(request.id or "")
            name = str(task.name)
            retries = int(request.retries or 0)
            chain_id = task_id if not retries else f"{task_id}-retry{retries}"
            # the worker's node name (celery@host): the dashboard shows where a task runs
            host = str(request.hostname or "")[:MAX_LABEL]
            meta = ChainMetadata(request_id=task_id, chain_id=chain_id, service=name,
                                 team=team, org_id=org_id,
                                 tags={"celery_task": name, "celery_retries": str(retries),
                                       "celery_host": host})
            coord = coordinator or Coordinator.default()
            token = incoming_token(request)
            ctx, rejoined = _open(coord, token, meta, root_config, max_cost_usd, max_steps,
                                  max_retries_total, timeout_ms, token_budget, iso)
            # A redelivered message (acks_late) replays the body in the same context:
            # call keys make each call count once across deliveries.
            ctx.enable_call_keys()
            try:
                # The body runs in a copy of the caller's contextvars with the context
                # entered: nothing to reset afterwards.
                with tracing.extracted(incoming_trace(request)):
                    return contextvars.copy_context().run(
                        _run_body, fn, args, kwargs, coord, ctx, name, task_id, rejoined,
                        interrupt)
            finally:
                try:
                    coord.store.flush()  # the body's spend is visible before its result
                except RedisError as exc:
                    log.warning("flushing %s: %s (retried at close)", ctx.chain_id, exc)
                _close_after_result(ctx)

        return cast(F, run)

    return decorate


_finished = threading.local()


def _close_after_result(ctx: ExecutionContext) -> None:
    """Close ``ctx`` (one round trip) once the task's result is stored, off the path of
    the caller waiting for it: at ``task_postrun``, which Celery's tracer (worker or
    ``apply()``) sends after the result, in this thread."""
    pending: list[ExecutionContext] | None = getattr(_finished, "contexts", None)
    if pending is None:
        pending = _finished.contexts = []
    pending.append(ctx)


def _close_finished(**_: Any) -> None:
    pending: list[ExecutionContext] | None = getattr(_finished, "contexts", None)
    while pending:
        ctx = pending.pop()
        # A body that sent sub-tasks leaves its context open for them (they may start
        # after it returned); its keys still expire, and its root's close still ends it.
        # close() and detach() log and keep writes queued if Redis is down.
        if sent_tasks(ctx):
            ctx.detach()
        else:
            ctx.close()


# connected at import, before any worker builds its tracers (they snapshot the receivers)
signals.task_postrun.connect(_close_finished, weak=False,
                             dispatch_uid="budget_context.close_finished")


def _run_body(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              coord: Coordinator, ctx: ExecutionContext, name: str, task_id: str,
              rejoined: bool, interrupt: bool) -> Any:
    ctx.__enter__()  # current_context() is ctx inside the body
    _check_runnable(coord, ctx, name, task_id, rejoined=rejoined)
    armed: Armed | None = None
    token = ctx.cancellation_token
    running.enter(token)
    try:
        if interrupt:
            armed = Armed(token)
        return fn(*args, **kwargs)
    except CancelledByContext as exc:
        raise TaskStoppedError(name, task_id, exc.reason, "interrupted while running") \
            from None
    finally:
        if armed is not None:
            armed.disarm()
        running.leave(token)


def _open(coord: Coordinator, token: str | None, meta: ChainMetadata,
          root_config: ExecutionConfig | None, max_cost_usd: float | None,
          max_steps: int | None, max_retries_total: int | None, timeout_ms: int,
          token_budget: TokenBudget | None,
          isolation: IsolationLevel = IsolationLevel.INHERIT) -> tuple[ExecutionContext, bool]:
    """The task's context: a new child of the token's context (one round trip, which also
    reports a stop above), or a new root; and whether it was rejoined. A message delivered
    again (``acks_late`` after a lost worker) joins the context its first delivery opened."""
    if token is None:
        if root_config is None:  # nothing to join, and no limits to open a root with
            given = {"max_cost_usd": max_cost_usd, "max_steps": max_steps,
                     "max_retries_total": max_retries_total}
            raise NoContextHeaderError(meta.service, meta.request_id,
                                       tuple(k for k, v in given.items() if v is None))
        try:
            return ExecutionContext(root_config, metadata=meta, coordinator=coord), False
        except ContextExistsError:
            return _rejoin(coord, (meta.chain_id,)), True
    try:
        return ExecutionContext.spawn_from_token(
            token, coord, max_cost_usd=max_cost_usd, max_steps=max_steps,
            max_retries_total=max_retries_total, timeout_ms=timeout_ms,
            token_budget=token_budget, metadata=meta, isolation=isolation), False
    except ContextExistsError:
        parent = coord.token_codec().decode(token, now=coord.redis_now_ms() / 1000,
                                    tenant=coord.tenant)
        return _rejoin(coord, (*parent.path, meta.chain_id)), True


def _rejoin(coord: Coordinator, path: tuple[str, ...]) -> ExecutionContext:
    log.info("context %s exists (message delivered again): joining it", path[-1])
    token = coord.token_codec().encode(root=path[0], path=path, tenant=coord.tenant, ttl_s=60,
                               now=coord.redis_now_ms() / 1000)
    try:
        return ExecutionContext.attach(token, coord)
    except ContextNotFoundError:  # not here: the id is another tree's (nothing recorded)
        raise ContextExistsError(path[-1]) from None


def _check_runnable(coord: Coordinator, ctx: ExecutionContext, name: str, task_id: str, *,
                    rejoined: bool) -> None:
    """Raise TaskStoppedError if the context (or an ancestor) is stopped, closed or past
    its deadline: the body must not run. A freshly opened context already knows (the open
    reported any stop above); a rejoined one reads its whole path."""
    if ctx.stop_reason is not None:
        raise TaskStoppedError(name, task_id, ctx.stop_reason, "context stopped")
    if not rejoined:
        return
    snap = ctx.get_snapshot()
    if snap.status != "running":
        reason = snap.abort_reason or snap.status
        where = f"at {snap.stopped_by}" if snap.stopped_by else "above"
        raise TaskStoppedError(name, task_id, reason, f"context stopped {where}")
    deadline = snap.deadline
    if deadline is not None and deadline.timestamp() * 1000 <= coord.redis_now_ms():
        raise TaskStoppedError(name, task_id, StopReason.TIMEOUT, "deadline passed while queued")
