"""What a call's logic asks of the store: a reserve (which an I/O thread can pipeline with
others) or any other work that may wait on Redis; and how a request runs in the caller's
own thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.paths import Path
from .tree import Held, Refused, Replayed, Store


@dataclass(frozen=True)
class Reserve:
    """Hold ``amounts`` at every level of ``path`` (see :meth:`Store.reserve`)."""

    store: Store
    path: Path
    reservation_id: str
    amounts: Sequence[str | int]
    keyed: bool
    resend: bool = True
    """Sent once more if the first attempt got no answer (the call has time for it)."""


@dataclass(frozen=True)
class Blocking:
    """Work that may wait on Redis (a round trip, a hook that reads Redis): it runs where
    waiting is allowed (the caller's thread, or the I/O thread for async callers)."""

    fn: Callable[[], Any]


Request = Reserve | Blocking


def run_here(request: Request) -> Any:
    """Run ``request`` in this thread and return its result."""
    if isinstance(request, Reserve):
        return reserve_now(request)
    return request.fn()


def reserve_now(r: Reserve) -> Held | Refused | Replayed:
    return r.store.reserve(r.path, r.reservation_id, r.amounts, keyed=r.keyed,
                           resend=r.resend)
