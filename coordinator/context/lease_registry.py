"""Which local handle has a budget slice (lease mode): made on a handle's first call,
given back when it closes or detaches, and all given back at exit."""

from __future__ import annotations

import atexit
import os
import threading
import weakref

from ..models_degrade import to_ppm
from ..store.errors import UNAVAILABLE
from .lease import LeaseSlice
from .state import ContextState

_slices: weakref.WeakKeyDictionary[ContextState, LeaseSlice] = weakref.WeakKeyDictionary()
_live: weakref.WeakSet[LeaseSlice] = weakref.WeakSet()
_slices_lock = threading.Lock()
_atexit_registered = False
_pid = os.getpid()
"""This process's id (kept at fork, rather than asked of the kernel on every call)."""


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def slice_of(state: ContextState) -> LeaseSlice | None:
    """The slice of a handle in lease mode (made on its first call); None in strict mode
    (no lease policy, or keyed call ids, whose replays need a reservation per call)."""
    policy = state.config.lease
    if policy is None or state.call_seq is not None:
        return None
    found = _slices.get(state)
    if found is not None and found.pid == _pid:
        return found
    with _slices_lock:
        found = _slices.get(state)
        if found is None or found.pid != _pid:  # a forked child takes its own
            degrade = state.config.degrade
            found = LeaseSlice(state.coord, state.path, policy,
                               to_ppm(degrade.below) if degrade is not None else 0)
            global _atexit_registered
            if not _atexit_registered:
                atexit.register(_give_back_all)
                _atexit_registered = True
            _slices[state] = found
            _live.add(found)
            state.coord.register(found)  # stops broadcast reach the slice too
    return found


def end_lease(state: ContextState) -> None:
    """Give back the slice of a handle that closes or detaches (no-op in strict mode)."""
    with _slices_lock:
        found = _slices.pop(state, None)
    if found is not None:
        found.close()
        state.coord.unregister(found)


def flush_lease(state: ContextState) -> None:
    """Write the calls served from a handle's slice now, so that what this process reads
    next includes them (no-op in strict mode, or with nothing to write)."""
    found = _slices.get(state)
    if found is not None:
        try:
            found.flush()
        except UNAVAILABLE:  # the read that follows reports it
            pass


def _give_back_all() -> None:
    """At exit: every slice of this process goes back (its spend written)."""
    for lease in list(_live):
        try:
            lease.close()
        except Exception:  # noqa: BLE001 - exiting: the lease expiry reclaims the rest
            pass
