"""The steps of a call waiting for approval (ExecutionConfig.approval_wait_s): a call
refused by a ceiling (a level stopped by it, or no room under it) shows its tree waiting,
waits for an operator to raise the limit and asks for its reservation again after each
wake, until it is held, refused for another reason, the context is aborted or times out,
or the wait's time is up. Plain requests (store/requests.py), answered by the executor
(context/approval.py) or a unit test's script."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..core.vocabulary import CEILING_REASONS
from ..store.replies import Held, Refused, Replayed
from ..store.requests import ApprovalEnd, ApprovalStart, AwaitApproval, Reap
from .state import ContextState
from .steps import Steps

Reply = Held | Refused | Replayed


def waits_for(state: ContextState, reason: str) -> bool:
    """Whether a call stopped for ``reason`` waits for approval instead of halting."""
    return state.config.approval_wait_s is not None and reason in CEILING_REASONS


def wait_for_approval(state: ContextState, refused: Refused,
                      reserve: Callable[[], Steps[Reply]]) -> Steps[Reply]:
    """Wait for a raise that lets the call ``refused`` fit, asking again with ``reserve``
    after each wake. Returns its reply: held (or replayed), or the last refusal (a
    ceiling's at the wait's end, or the stop that cancelled the context)."""
    wait_s = state.config.approval_wait_s
    assert wait_s is not None
    wait_ms = max(1, math.ceil(wait_s * 1000))
    until_ms: int = yield ApprovalStart(state.path, refused.reason, wait_ms)
    if not until_ms:  # the tree is gone
        return refused
    try:
        reply: Reply = refused
        while True:
            time_left: bool = yield AwaitApproval(state.path, until_ms)
            token = state.cancellation_token
            if token.cancelled:
                reason = token.reason or refused.reason
                reply = Refused(-1, reason, f"stopped: {reason}", True, refused.now_ms)
                break
            reply = yield from reserve()
            if not isinstance(reply, Refused) or not waits_for(state, reply.reason):
                break
            if reply.expired:
                yield Reap(state.path, reply.expired)
            if not time_left:
                break
    except GeneratorExit:
        raise
    except BaseException:
        yield ApprovalEnd(state.path, until_ms)
        raise
    yield ApprovalEnd(state.path, until_ms)
    if isinstance(reply, Held):  # held at every level: no ceiling stops the path now
        state.handle_lift(CEILING_REASONS)
    return reply
