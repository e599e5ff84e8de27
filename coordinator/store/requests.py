"""What a call's steps ask of the store, as plain data: frozen values naming the work, never
the store itself nor a closure. The executor (context/executor.py) maps each request to the
Store call that answers it; the drivers (context/steps.py) run it in the caller's thread or
on the I/O thread; a unit test answers it with a scripted reply (tests/unit/).

A request whose ``waits`` is false only queues a write for the next round trip (the
flusher sends it): it never waits on Redis, and the async driver runs it on the event
loop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..core.paths import Path
from ..core.vocabulary import FinishOutcome
from ..models_records import NodeFields
from .records import ReservationRecord

Expired = Sequence[tuple[str, ReservationRecord]]
"""Holds a reply found expired: (reservation or slice id, its record)."""


@dataclass(frozen=True)
class EdgeTerms:
    """How a reserve meets the edge of a budget (reserve.lua, docs/degrade.md)."""

    final: bool = False
    """The call may spend the final reserves of its levels."""
    rungs: tuple[str | int, ...] = ()
    """Its model ladder, the requested model first: (model, worst case in micro-USD, ...);
    empty when the call names no ladder."""
    below_ppm: int = 0
    """The ladder's threshold in parts per million of a ceiling."""


PLAIN = EdgeTerms()
"""An ordinary call without a ladder."""


@dataclass(frozen=True)
class Reserve:
    """Hold ``amounts`` at every level of ``path`` (:meth:`Store.reserve`). Reply:
    ``Held``, ``Refused`` or ``Replayed``."""

    path: Path
    reservation_id: str
    amounts: Sequence[str | int]
    keyed: bool
    resend: bool = True
    """Sent once more if the first attempt got no answer (the call has time for it)."""
    terms: EdgeTerms = PLAIN
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class Finish:
    """Settle (outcome ``ok``) or release (``error``, ``skip``) a reservation, with its
    node record (or none); sent now, or queued (``write_behind``, or while the tree's
    node is known down). Reply: the levels it stopped (none when it was queued: its stops
    still happen in Redis, and are broadcast)."""

    path: Path
    reservation_id: str
    outcome: FinishOutcome
    node: NodeFields | None
    amounts: Sequence[str | int]
    write_behind: bool

    @property
    def waits(self) -> bool:
        return not self.write_behind


@dataclass(frozen=True)
class Open:
    """Open the context in Redis (it was unreachable when its handle was made); raises
    like a reserve while Redis is away. Reply: None."""

    ctx_id: str
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class Flush:
    """Send every queued write now (this process's settles on their way). Reply: None."""

    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class TopUp:
    """Top up quota grant ``grant`` (reserve.lua's '<i> <why>') of ``path``'s tree so that
    ``need`` (by quota dimension) fits (quotas/keeper.py). Reply: ``Refill``."""

    path: Path
    grant: str
    need: dict[str, int]
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class TakeSlice:
    """Give lease slice ``owner``'s old slice back and take a new one, serving the call's
    ``amounts`` from it (context/lease.py; a ladder call on the rung the slice chooses of
    ``rungs``, as ``EdgeTerms.rungs``). Reply: (served: 0, else 1 or the rung's number;
    expired holds; stops)."""

    owner: str
    amounts: Sequence[str | int]
    rungs: Sequence[str | int] = ()
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class WriteSlice:
    """Write lease slice ``owner``'s batch now; with ``give_back``, return its rest too.
    Reply: the stops it caused."""

    owner: str
    give_back: bool
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class Reap:
    """Settle holds of ``path``'s tree found expired (their process stopped renewing
    them): a reservation at its estimate, a slice's unflushed part (context/reaping.py).
    Queued. Reply: None."""

    path: Path
    expired: Expired
    waits: ClassVar[bool] = False


@dataclass(frozen=True)
class Refusal:
    """Record a call refused before it ran: its node, counted on the context, and the
    event once per reason. Queued. Reply: None."""

    path: Path
    reason: str
    event: str
    """The SafetyEvent's JSON."""
    node: str
    """The node record's JSON."""
    waits: ClassVar[bool] = False


@dataclass(frozen=True)
class Event:
    """Append a SafetyEvent (JSON) to the context's event log; with ``once``, only if no
    event was recorded for that key yet (event_once.lua). Queued. Reply: None."""

    path: Path
    event: str
    once: str | None = None
    waits: ClassVar[bool] = False


@dataclass(frozen=True)
class ChainEvent:
    """Append an event (JSON) to the causal chain of tree ``root`` (data/chain.py).
    Queued. Reply: None."""

    root: str
    event: str
    waits: ClassVar[bool] = False


@dataclass(frozen=True)
class ApprovalStart:
    """Show ``path``'s tree waiting for approval of a call stopped for ``reason``, for
    ``wait_ms`` (store/approval.py). Reply: the wait's end, approval_until_ms (Redis ms;
    0 when the tree is gone)."""

    path: Path
    reason: str
    wait_ms: int
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class AwaitApproval:
    """Wait until a limit of ``path`` is raised (a lift heard), the context is aborted or
    timed out (its cancellation token), a poll interval passes, or Redis time reaches
    ``until_ms``: a blocked thread, or an awaited future on the event loop (steps.py).
    Reply: whether time is left before ``until_ms``."""

    path: Path
    until_ms: int
    waits: ClassVar[bool] = True


@dataclass(frozen=True)
class ApprovalEnd:
    """Stop showing the wait ``ApprovalStart`` began (ending at ``until_ms``), unless a
    later wait replaced it. Queued. Reply: None."""

    path: Path
    until_ms: int
    waits: ClassVar[bool] = False


StoreRequest = Reserve | Finish | Open | Flush | TopUp | TakeSlice | WriteSlice | Reap | \
    Refusal | Event | ChainEvent | ApprovalStart | AwaitApproval | ApprovalEnd
