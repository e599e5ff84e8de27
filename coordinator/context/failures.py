"""How a wrapped function's failure is told apart: a caller bug (the function cannot be
called as given, or an ``awrap_*`` function returns no awaitable), a retryable failure
(``WrapOptions.retry_on``, default every exception), or one raised at once; and what a
failed call's node and the chain's events keep of it."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import NotAwaitableError, ReportOutsideCallError
from ..models import Decision, WrapOptions
from ..models_records import NodeFields
from ..store.requests import Event
from .state import ContextState

ERROR_TEXT_MAX = 500
"""The characters of an error's message a node keeps."""


class CallerBug(Exception):  # noqa: N818 - a carrier, never seen outside the wrap loops
    """A wrap's function could not run as given: ``error`` is raised to the caller at once,
    no retry spent. ``ran``: it did run and returned ``result`` (charged as a return)."""

    def __init__(self, error: BaseException, *, ran: bool = False, result: Any = None):
        super().__init__(str(error))
        self.error, self.ran, self.result = error, ran, result


def _at_the_call(exc: BaseException) -> bool:
    """Raised by the call expression itself (arguments that do not bind), not from
    inside the function: the traceback has no frame below the caller's."""
    tb = exc.__traceback__
    return tb is not None and tb.tb_next is None


def call_sync(fn: Callable[[], Any]) -> Any:
    """``fn()``; a TypeError of its own call signature becomes a CallerBug."""
    try:
        return fn()
    except TypeError as exc:
        if _at_the_call(exc):
            raise CallerBug(exc) from None
        raise


async def call_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    """``await fn()``; a TypeError of its call signature, or a result that cannot be
    awaited, becomes a CallerBug."""
    try:
        awaitable = fn()
    except TypeError as exc:
        if _at_the_call(exc):
            raise CallerBug(exc) from None
        raise
    if not inspect.isawaitable(awaitable):
        raise CallerBug(NotAwaitableError(fn, awaitable), ran=True, result=awaitable)
    return await awaitable


def retryable(exc: BaseException, options: WrapOptions) -> bool:
    """Whether a failure spends a retry (and may be retried): every exception unless
    ``options.retry_on`` names the retryable types; a caller bug never."""
    if isinstance(exc, ReportOutsideCallError):
        return False
    return options.retry_on is None or isinstance(exc, options.retry_on)


def add_error(record: NodeFields, exc: BaseException) -> None:
    """Add to the node record of a call that raised ``exc`` the error's fields."""
    record["error_type"] = type(exc).__name__
    record["error_message"] = str(exc)[:ERROR_TEXT_MAX]


def note_once(state: ContextState, event_type: str, key: str, reason: str,
              decision: Decision, **metadata: Any) -> Event:
    """The request recording a chain event ``event_type`` once per (context, ``key``)
    (event_once.lua)."""
    event = state.event(event_type, reason[:ERROR_TEXT_MAX], decision, **metadata)
    return Event(state.path, event.model_dump_json(), once=f"{event_type}:{key}"[:300])


def note_failure(state: ContextState, call_id: str, exc: BaseException,
                 decision: Decision) -> Event:
    """The request recording ``call_failed``, once per (context, error type)."""
    name = type(exc).__name__
    return note_once(state, "call_failed", name, f"{name}: {exc}", decision, node_id=call_id,
              error_type=name)
