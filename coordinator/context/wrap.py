"""The wrap loops: run a call's function between ``begin`` and ``complete``/``fail`` (see
call.py), synchronously or as an asyncio task cancelled with its context, retrying as its
options allow. Both loops share every step but the call itself, and differ only in how
they wait for the store (steps.py: ``drive`` here, ``adrive`` on the I/O thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..core.usage import reset_collector, set_collector
from ..models import Decision, WrapOptions
from . import tracing
from .call import Call, Kind, Outcome, active_call, begin
from .cancellation import CancelledByContext
from .failures import CallerBug, call_async, call_sync
from .settling import caller_bug, complete, fail
from .state import ContextState
from .steps import adrive, drive

_NO_OPTIONS = WrapOptions()
_O = TypeVar("_O", Outcome, "Outcome | None")


def checked_options(fn: object, options: object) -> WrapOptions:
    """The options of a wrap call, once its arguments are known to be right (before
    anything is reserved): raises TypeError otherwise."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments; got {fn!r}")
    if options is None:
        return _NO_OPTIONS
    if not isinstance(options, WrapOptions):
        raise TypeError(f"options must be a WrapOptions; got {options!r}")
    return options


def run_sync(state: ContextState, owner: object, kind: Kind, fn: Callable[[], Any],
             options: WrapOptions | None) -> Outcome:
    opts = checked_options(fn, options)
    attempts = 1 + (opts.retry_policy_override or 0)
    for attempt in range(attempts):
        span = tracing.start_span(state, kind, opts)
        call = drive(begin(state, owner, kind, opts))
        if isinstance(call, Outcome):
            return _traced(span, state, call, None)
        call.fn = fn
        vars_ = _enter(call)
        try:
            with tracing.in_span(span):
                result = call_sync(fn)
        except CallerBug as bug:  # raised at once, no retry spent
            drive(caller_bug(call, bug))
            _traced(span, state, None, call, bug.error)
            raise bug.error from None
        except BaseException as exc:  # noqa: BLE001 - every outcome must settle
            outcome = drive(fail(call, exc))
            _traced(span, state, outcome, call, exc)
            if outcome is None:
                raise
            if outcome.decision == Decision.RETRY and attempt + 1 < attempts:
                continue
            return outcome
        finally:
            _exit(call, vars_)
        return _traced(span, state, drive(complete(call, result)), call)
    raise AssertionError("unreachable")


async def run_async(state: ContextState, owner: object, kind: Kind,
                    fn: Callable[[], Awaitable[Any]], options: WrapOptions | None) -> Outcome:
    opts = checked_options(fn, options)
    attempts = 1 + (opts.retry_policy_override or 0)
    loop = asyncio.get_running_loop()
    io = state.coord.io
    for attempt in range(attempts):
        span = tracing.start_span(state, kind, opts)
        call = await adrive(begin(state, owner, kind, opts), io)
        if isinstance(call, Outcome):
            return _traced(span, state, call, None)
        call.fn = fn
        vars_ = _enter(call)
        try:
            with tracing.in_span(span):
                task = loop.create_task(call_async(fn))
        finally:
            _exit(call, vars_, detach=False)
        unhook = call.token.on_cancel(_canceller(loop, task))
        try:
            result = await task
        except CallerBug as bug:  # raised at once, no retry spent
            await adrive(caller_bug(call, bug), io)
            _traced(span, state, None, call, bug.error)
            raise bug.error from None
        except BaseException as exc:  # noqa: BLE001 - every outcome must settle
            if isinstance(exc, asyncio.CancelledError) and call.token.cancelled:
                exc = CancelledByContext(call.token.reason or "cancelled")
            outcome = await adrive(fail(call, exc), io)
            _traced(span, state, outcome, call, exc)
            if outcome is None:
                raise
            if outcome.decision == Decision.RETRY and attempt + 1 < attempts:
                continue
            return outcome
        finally:
            unhook()
            if call.token is not state.cancellation_token:
                call.token.detach()
        return _traced(span, state, await adrive(complete(call, result), io), call)
    raise AssertionError("unreachable")


def _traced(span: Any, state: ContextState, outcome: _O, call: Call | None,
            error: BaseException | None = None) -> _O:
    """End the call's span (when tracing) with how it ended; returns ``outcome``."""
    if span is not None:
        tracing.end_span(span, state, decision=outcome.decision.value if outcome else "ERROR",
                         reason=outcome.reason if outcome else None,
                         settled=call.settled if call else None, error=error)
    return outcome


def _enter(call: Call) -> tuple[Any, Any]:
    return active_call.set(call), set_collector(call.collector)


def _exit(call: Call, vars_: tuple[Any, Any], *, detach: bool = True) -> None:
    reset_collector(vars_[1])
    active_call.reset(vars_[0])
    if detach and call.token is not call.state.cancellation_token:
        call.token.detach()


def _canceller(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]
               ) -> Callable[[str], None]:
    """A token callback (run on any thread) that cancels ``task`` on its loop."""
    def cancel(_reason: str) -> None:
        loop.call_soon_threadsafe(task.cancel)
    return cancel
