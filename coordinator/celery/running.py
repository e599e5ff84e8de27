"""The task bodies running in this process, so that a body stopped by its context yields
to the stopped bodies still running before its task's bookkeeping starts.

When a stop reaches many bodies of one process at once (an abort of a fan-out on the
threads pool), the first to stop would otherwise store its result, send its ack and close
its context while the others wait for the GIL to even notice the stop: the last one
observed it only after all that work (tens of milliseconds for 50 tasks). Stopping
everything first and reporting afterwards is what an abort is for.
"""

from __future__ import annotations

import threading

from coordinator.context.cancellation import CancellationToken

# A body that ignores its token (interrupt=False, blocked in C) must not hold the others'
# results back for long.
MAX_YIELD_S = 0.1

_cond = threading.Condition()
_running: list[CancellationToken] = []


def enter(token: CancellationToken) -> None:
    """A body guarded by ``token`` starts."""
    with _cond:
        _running.append(token)


def leave(token: CancellationToken) -> None:
    """A body ends. If it was stopped, wait (at most MAX_YIELD_S) until every other
    stopped body of this process has ended too."""
    with _cond:
        _running.remove(token)
        if not token.cancelled:
            return
        if not _stopped_left():
            _cond.notify_all()  # the last stopped body: the others' bookkeeping may go on
            return
        # woken once, by the last one (waking every waiter at every exit would have them
        # all fight the bodies still to stop for the GIL)
        _cond.wait_for(lambda: not _stopped_left(), MAX_YIELD_S)


def _stopped_left() -> bool:
    return any(t.cancelled for t in _running)
