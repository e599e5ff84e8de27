"""What the two SDK transports do not share as text (transport.py is generated from
async_transport.py): which requests they budget (``exchange_for``), and, in each flavour,
how a call's steps are driven (``run_steps``: here; ``arun_steps``: on the store's I/O
thread, so the event loop never waits on Redis) and how a request is sent so that an
abort ends its wait for the response's headers (``send_request``: the waiting connection
is shut down; ``asend_request``: the request's task is cancelled)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx2

from ..context.cancellation import CancelledByContext
from ..context.execution import ExecutionContext
from ..context.executor import Executor
from ..context.steps import Steps, adrive, drive
from ..models import Decision
from .errors import BudgetExceededError
from .exchange import Exchange, cut_waiting
from .prepare import TransportSettings, context_for, prepare

T = TypeVar("T")


def exchange_for(request: httpx2.Request, context: ExecutionContext | None,
                 settings: TransportSettings, error_class: type[BudgetExceededError]
                 ) -> tuple[Exchange, ExecutionContext, httpx2.Request] | None:
    """The budgeted exchange of an LLM request, its context and the request to send;
    None for a request to pass through untouched (not an LLM request, or no context
    while ``require_context`` is off)."""
    prepared = prepare(request, settings)
    ctx = context_for(context) if prepared is not None else None
    if prepared is None or ctx is None:
        if prepared is not None and settings.require_context:
            raise no_context(error_class)
        return None
    plan, request = prepared
    return Exchange(ctx, plan, error_class, settings.operation_name), ctx, request


def no_context(error_class: type[BudgetExceededError]) -> BudgetExceededError:
    return error_class(decision=Decision.HALT, reason="no_context",
                       detail="an LLM request was made outside any context "
                              "(require_context is set)", chain_id="", snapshot=None)


def run_steps(ex: Exchange, steps: Steps[T]) -> T:
    return drive(steps, Executor(ex.state))


async def arun_steps(ex: Exchange, steps: Steps[T]) -> T:
    return await adrive(steps, Executor(ex.state), ex.state.coord.io)


def send_request(ex: Exchange, inner: httpx2.BaseTransport, request: httpx2.Request,
                 failed: Callable[[Exchange, BaseException], BaseException]
                 ) -> httpx2.Response:
    """``inner``'s response; an abort while it waits for the headers shuts down the
    connection it waits on (``cut_waiting``). A failure raises ``failed(ex, exc)``,
    settled while the abort is still hooked."""
    assert ex.call is not None
    unhook = ex.call.token.on_cancel(lambda _reason: cut_waiting(inner, request.extensions))
    try:
        return inner.handle_request(request)
    except BaseException as exc:  # noqa: BLE001 - every outcome must settle
        raise failed(ex, exc) from exc
    finally:
        unhook()


async def asend_request(ex: Exchange, inner: httpx2.AsyncBaseTransport,
                        request: httpx2.Request,
                        failed: Callable[[Exchange, BaseException], Awaitable[BaseException]]
                        ) -> httpx2.Response:
    """``inner``'s response, awaited in a task that an abort (or the call's timeout)
    cancels while it waits. A failure raises ``await failed(ex, exc)``."""
    try:
        return await _abortable(ex, lambda: inner.handle_async_request(request))
    except BaseException as exc:  # noqa: BLE001 - every outcome must settle
        raise await failed(ex, exc) from exc


async def _abortable(ex: Exchange, send: Callable[[], Awaitable[T]]) -> T:
    """Await ``send()``, cancelled when the call is (abort, timeout) while it waits."""
    assert ex.call is not None
    token = ex.call.token
    loop = asyncio.get_running_loop()
    task = loop.create_task(_await(send))

    def cancel(_reason: str) -> None:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass

    unhook = token.on_cancel(cancel)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if token.cancelled and (current is None or not current.cancelling()):
            raise CancelledByContext(token.reason or "cancelled") from None
        raise
    finally:
        unhook()


async def _await(send: Callable[[], Awaitable[T]]) -> T:
    return await send()
