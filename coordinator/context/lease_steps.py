"""Lease mode's part of a call's steps (call.py): taking a slice is a store request like a
reserve; a call served from the slice is settled in-process, and only a batch that must be
written now (or the slice's give-back) becomes a request. One implementation for the sync
and async drivers (steps.py). Requests name a slice by its owner id; the executor finds
it with :func:`slice_named`."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import partial

from ..core.vocabulary import FinishOutcome
from ..models_records import NodeFields
from ..store.requests import Reap, TakeSlice, WriteSlice
from ..store.tree import Stop
from .lease import LeaseSlice
from .state import ContextState
from .steps import Steps

_named: weakref.WeakValueDictionary[str, LeaseSlice] = weakref.WeakValueDictionary()
"""The slices requests were made for, by owner id (a call in flight holds its own)."""


def slice_named(owner: str) -> LeaseSlice:
    """The slice a request names."""
    return _named[owner]


def _named_by(lease: LeaseSlice) -> str:
    _named[lease.owner] = lease
    return lease.owner


def take_slice(state: ContextState, lease: LeaseSlice, amounts: Sequence[str | int],
               rungs: Sequence[str | int] = ()) -> Steps[int]:
    """Give the old slice back and take a new one (one round trip: on the I/O thread for
    async callers), serving the call from it (a ladder call on the rung the slice
    chooses of ``rungs``); reap the expired holds it found. Whether the call was served:
    0 (it takes a strict reserve), else 1 or the rung's number; raises UNAVAILABLE like
    a reserve when Redis does not answer."""
    served, expired, stops = yield TakeSlice(_named_by(lease), amounts, rungs)
    for stop in stops:
        if stop.ctx_id in state.path.ids:
            state.handle_stop(stop.reason)
    if expired:
        yield Reap(state.path, expired)
    return int(served) if state.stopped is None else 0


def finish_served(lease: LeaseSlice, held: dict[str, int], outcome: FinishOutcome,
                  record: NodeFields, amounts: Sequence[str | int], *, now: bool
                  ) -> Steps[list[Stop]]:
    """Settle a call served from the slice: counted in the batch without a request, unless
    the batch must be written now (then one request, whose stops are returned)."""
    action = lease.settle(held, outcome, record, amounts, now=now)
    if action is None:
        return []
    stops: list[Stop] = yield WriteSlice(_named_by(lease), action == "give_back")
    return stops


def release_promise(lease: LeaseSlice, held: dict[str, int], record: NodeFields) -> None:
    """Give back the promise of a served call that will not run (a hook refused it or
    failed), without waiting: a write it calls for goes to a background thread."""
    action = lease.settle(held, FinishOutcome.SKIP, record, [], now=False)
    if action is not None:
        lease.coord.call_later(0, partial(_write, lease, action))


def _write(lease: LeaseSlice, action: str) -> None:
    """Write a slice's batch (with its give-back) from a background thread."""
    if action == "give_back":
        lease.give_back()
    else:
        lease.flush()
