"""The wrap loop: run a call's function between ``begin`` and ``complete``/``fail`` (see
call.py), retrying as its options allow. The loop is written once (``_attempts``), as a
generator that yields what it needs next: a call's steps to drive, the function's run,
and the end of the run; ``run_sync`` runs the function here, ``run_async`` as an asyncio
task cancelled with its context (steps.py: ``drive`` here, ``adrive`` on the I/O thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from ..core.usage import reset_collector, set_collector
from ..models import Decision, WrapOptions
from . import tracing
from .call import Call, Kind, Outcome, active_call, begin
from .cancellation import CancelledByContext
from .executor import Executor
from .failures import CallerBug, call_async, call_sync
from .settling import caller_bug, complete, fail
from .state import ContextState
from .steps import Steps, adrive, drive

_NO_OPTIONS = WrapOptions()
_O = TypeVar("_O", Outcome, "Outcome | None")


class Run:
    """Run the function as ``call``, in ``span``: the driver sends back its result, or
    throws in its error, and stays in the call (its context variables, its token) until
    ``Leave``. (Plain slotted classes: one of each is made per call.)"""

    __slots__ = ("call", "span")

    def __init__(self, call: Call, span: Any) -> None:
        self.call, self.span = call, span


class Leave:
    """The run is over and, if it raised, settled: the driver leaves ``call``."""

    __slots__ = ("call",)

    def __init__(self, call: Call) -> None:
        self.call = call


Need = Run | Leave | Steps[Any]
"""What the loop needs next: a run, its end, or a call's steps (whose value it is sent)."""


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


def _attempts(state: ContextState, owner: object, kind: Kind, fn: Callable[[], Any],
              options: WrapOptions | None) -> Generator[Need, Any, Outcome]:
    """The wrap's attempts, each begun, run and settled; returns how the wrap ended."""
    opts = checked_options(fn, options)
    attempts = 1 + (opts.retry_policy_override or 0)
    for attempt in range(attempts):
        span = tracing.start_span(state, kind, opts)
        call: Call | Outcome = yield begin(state, owner, kind, opts)
        if isinstance(call, Outcome):
            return _traced(span, state, call, None)
        call.fn = fn
        try:
            result = yield Run(call, span)
        except CallerBug as bug:  # raised at once, no retry spent
            yield caller_bug(call, bug)
            _traced(span, state, None, call, bug.error)
            raise bug.error from None
        except BaseException as exc:  # noqa: BLE001 - every outcome must settle
            outcome: Outcome | None = yield fail(call, exc)
            _traced(span, state, outcome, call, exc)
            if outcome is None:
                raise
            if outcome.decision == Decision.RETRY and attempt + 1 < attempts:
                continue
            return outcome
        finally:
            yield Leave(call)
        completed: Outcome = yield complete(call, result)
        return _traced(span, state, completed, call)
    raise AssertionError("unreachable")


def run_sync(state: ContextState, owner: object, kind: Kind, fn: Callable[[], Any],
             options: WrapOptions | None) -> Outcome:
    loop = _Loop(_attempts(state, owner, kind, fn, options))
    execute = Executor(state)
    entered: tuple[Any, Any] = (None, None)
    value: Any = None
    error: BaseException | None = None
    while (need := loop.resume(value, error)) is not None:
        value = error = None
        try:
            if type(need) is Run:
                entered = _enter(need.call)
                with tracing.in_span(need.span):
                    value = call_sync(fn)
            elif type(need) is Leave:
                _exit(need.call, entered)
            else:
                value = drive(need, execute)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the loop decides what it means
            error = exc
    return loop.outcome


async def run_async(state: ContextState, owner: object, kind: Kind,
                    fn: Callable[[], Awaitable[Any]], options: WrapOptions | None) -> Outcome:
    loop = _Loop(_attempts(state, owner, kind, fn, options))
    events, io, execute = asyncio.get_running_loop(), state.coord.io, Executor(state)
    unhook: Callable[[], None] = _nothing
    value: Any = None
    error: BaseException | None = None
    while (need := loop.resume(value, error)) is not None:
        value = error = None
        try:
            if type(need) is Run:
                call = need.call
                vars_ = _enter(call)
                try:
                    with tracing.in_span(need.span):
                        task = events.create_task(call_async(fn))
                finally:
                    _exit(call, vars_, detach=False)
                unhook = call.token.on_cancel(_canceller(events, task))
                try:
                    value = await task
                except asyncio.CancelledError:
                    if not call.token.cancelled:
                        raise
                    error = CancelledByContext(call.token.reason or "cancelled")
            elif type(need) is Leave:
                unhook()
                unhook = _nothing
                if need.call.token is not state.cancellation_token:
                    need.call.token.detach()
            else:
                value = await adrive(need, execute, io)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the loop decides what it means
            error = exc
    return loop.outcome


class _Loop:
    """The attempts generator, resumed by a driver with the answer to its last need."""

    __slots__ = ("_attempts", "outcome")

    def __init__(self, attempts: Generator[Need, Any, Outcome]) -> None:
        self._attempts = attempts
        self.outcome: Outcome

    def resume(self, value: Any, error: BaseException | None) -> Need | None:
        """The next need, given the last one's value or error; None once the loop has
        ended (its outcome is then set)."""
        try:
            return (self._attempts.send(value) if error is None
                    else self._attempts.throw(error))
        except StopIteration as stop:
            self.outcome = stop.value
            return None


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


def _nothing() -> None:
    """The unhook of a run not started."""


def _canceller(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]
               ) -> Callable[[str], None]:
    """A token callback (run on any thread) that cancels ``task`` on its loop."""
    def cancel(_reason: str) -> None:
        loop.call_soon_threadsafe(task.cancel)
    return cancel
