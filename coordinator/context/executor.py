"""The executor: answers a call's requests (plain data: store/requests.py, hooks.py) with
the real Store calls, hooks and lease slices of one context. The drivers (steps.py) hand
it each request; a unit test hands its own script instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..quotas.keeper import keeper_of
from ..store.data import DataStore
from ..store.errors import UNAVAILABLE
from ..store.requests import (
    ApprovalEnd,
    ApprovalStart,
    AwaitApproval,
    ChainEvent,
    Event,
    Finish,
    Flush,
    Open,
    Refusal,
    Reserve,
    TakeSlice,
    TopUp,
    WriteSlice,
)
from ..store.requests import Reap as ReapRequest
from ..store.tree import Stop
from . import approval
from .hooks import (
    AfterRaise,
    AfterReturn,
    BeforeCall,
    ReleaseProbe,
    after_raise,
    after_return,
    before_call,
    release_probe,
)
from .lease_steps import slice_named
from .reaping import reap
from .state import ContextState
from .steps import Request


class Executor:
    """Runs the requests of calls on ``state``'s context, in the calling thread."""

    __slots__ = ("state",)

    def __init__(self, state: ContextState) -> None:
        self.state = state

    def __call__(self, request: Request) -> Any:
        return _RUN[type(request)](self.state, request)

    async def await_approval(self, request: AwaitApproval) -> bool:
        """The wait for approval on the event loop (adrive's; ``__call__`` blocks)."""
        return await approval.await_async(self.state, request)


def _reserve(state: ContextState, r: Reserve) -> Any:
    return state.store.reserve(r.path, r.reservation_id, r.amounts, keyed=r.keyed,
                               resend=r.resend, terms=r.terms)


def _finish(state: ContextState, r: Finish) -> list[Stop]:
    """Written behind when asked, or queued while the tree's node is known down or does
    not answer (if it never lands, the reservation's lease charges the estimate)."""
    store, backend = state.store, state.coord.backend
    behind = r.write_behind
    if backend.allow(state.backend_key):
        try:
            stops = store.finish(r.path, r.reservation_id, outcome=r.outcome, node=r.node,
                                 amounts=r.amounts, write_behind=behind)
        except UNAVAILABLE as exc:
            backend.failed(exc, state.backend_key)
        else:
            if behind:
                state.coord.schedule_flush()
            return stops
    store.finish(r.path, r.reservation_id, outcome=r.outcome, node=r.node,
                 amounts=r.amounts, write_behind=True)
    state.coord.schedule_flush()
    return []


def _open(state: ContextState, _: Open) -> None:
    state.ensure_open()


def _flush(state: ContextState, _: Flush) -> None:
    state.store.flush()


def _top_up(state: ContextState, r: TopUp) -> Any:
    return keeper_of(state.coord).refill(r.path, r.grant, r.need)


def _take_slice(state: ContextState, r: TakeSlice) -> Any:
    return slice_named(r.owner).refill(r.amounts, r.rungs)


def _write_slice(state: ContextState, r: WriteSlice) -> Any:
    return slice_named(r.owner).flush(give_back=r.give_back)


def _reap(state: ContextState, r: ReapRequest) -> None:
    reap(state, r.path, r.expired)


def _refusal(state: ContextState, r: Refusal) -> None:
    state.store.queue_refusal(r.path, r.reason, r.event, r.node)
    state.coord.schedule_flush()


def _chain_event(state: ContextState, r: ChainEvent) -> None:
    DataStore(state.store).queue_chain_event(r.root, r.event)
    state.coord.schedule_flush()


def _event(state: ContextState, r: Event) -> None:
    if r.once is None:
        state.store.queue_event(r.path, r.event)
    else:
        state.store.queue_stop_event(r.path, r.once, r.event)
    state.coord.schedule_flush()


_RUN: dict[type, Callable[[ContextState, Any], Any]] = {
    Reserve: _reserve, Finish: _finish, Open: _open, Flush: _flush, TopUp: _top_up,
    TakeSlice: _take_slice, WriteSlice: _write_slice, ReapRequest: _reap,
    Refusal: _refusal, Event: _event, ChainEvent: _chain_event, BeforeCall: before_call,
    AfterReturn: after_return, AfterRaise: after_raise, ReleaseProbe: release_probe,
    ApprovalStart: approval.start, AwaitApproval: approval.await_sync,
    ApprovalEnd: approval.end,
}
"""Each request type's runner."""
