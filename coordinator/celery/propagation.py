"""Carrying the context token in Celery messages (like OpenTelemetry carries
``traceparent``): injected into the header ``budget_context`` at ``before_task_publish``,
read back from the task's request in the worker."""

from __future__ import annotations

import time
import weakref
from datetime import datetime, timezone
from typing import Any

from celery import Celery, signals
from celery._state import get_current_task

from coordinator.context import tracing
from coordinator.context.execution import ExecutionContext, current_context

from . import freeze
from .retries import count_retry

HEADER = "budget_context"
TOKEN_REUSE_S = 60.0

_tokens: weakref.WeakKeyDictionary[ExecutionContext, tuple[str, float]] = \
    weakref.WeakKeyDictionary()


def incoming_token(request: Any) -> str | None:
    """The token a task's message carried, or None."""
    token = getattr(request, HEADER, None)
    if token is None:
        headers = getattr(request, "headers", None) or {}
        token = headers.get(HEADER)
    return str(token) if token else None


def incoming_trace(request: Any) -> dict[str, Any]:
    """The W3C trace headers a task's message carried (empty without them)."""
    headers = getattr(request, "headers", None) or {}
    return {name: getattr(request, name, None) or headers.get(name)
            for name in ("traceparent", "tracestate")}


def _before_publish(sender: Any = None, headers: dict[str, Any] | None = None,
                    **_: Any) -> None:
    if headers is None:
        return
    running = get_current_task()
    request = running.request if running is not None else None
    incoming = incoming_token(request) if request is not None else None
    ctx = current_context()
    if request is not None and headers.get("id") == request.id:
        # self.retry(): the retry takes the place of this attempt, under the same parent.
        # It is charged before the message leaves, so the next attempt sees the count.
        if ctx is not None:
            count_retry(ctx, str(sender))
        if incoming:
            headers[HEADER] = incoming
        return
    if headers.get(HEADER):
        return  # an explicit token wins
    if ctx is not None:
        _inject(headers, _token_of(ctx), ctx.deadline)
    elif incoming:
        # Canvas continuations (the next task of a chain, a chord's callback) are sent by
        # the worker after the body returned: they join the tree the finished task joined.
        _inject(headers, incoming, None)


def sent_tasks(ctx: ExecutionContext) -> bool:
    """Whether a task was sent while ``ctx`` was current (in this process)."""
    return ctx in _tokens


def _token_of(ctx: ExecutionContext) -> str:
    """``ctx.token``, minted at most once a minute per context (a fan-out of many sends
    signs once). A token expires at the context's deadline or a day after it is minted,
    so one reused within the minute is as good as a fresh one."""
    now = time.monotonic()
    cached = _tokens.get(ctx)
    if cached is not None and now - cached[1] < TOKEN_REUSE_S:
        return cached[0]
    token = ctx.token
    _tokens[ctx] = (token, now)
    return token


def _inject(headers: dict[str, Any], token: str, deadline: datetime | None) -> None:
    headers[HEADER] = token
    tracing.inject(headers)  # W3C traceparent beside the token (no-op without tracing)
    if deadline is None:
        return
    # Celery itself drops a message still queued past the context's deadline
    current = headers.get("expires")
    if current:
        try:
            parsed = datetime.fromisoformat(str(current))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            deadline = min(deadline, parsed)
        except ValueError:
            pass
    headers["expires"] = deadline.isoformat()


def install(app: Celery | None = None) -> None:
    """Connect the propagation signal (idempotent). Call it once in every process that
    sends or runs contained tasks, e.g. next to ``app = Celery(...)``; the signal is
    global, so it covers every app of the process. In worker processes it also freezes
    the objects that exist once the worker is ready (see :mod:`coordinator.celery.freeze`)."""
    signals.before_task_publish.connect(_before_publish, weak=False,
                                        dispatch_uid="budget_context.before_publish")
    freeze.install()
