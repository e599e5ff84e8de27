"""The typed results of the tree scripts' replies (a reservation held, refused or
replayed; a settle's or release's outcome; an abort's; the stops they made; a context's
state as read), each reply decoded once by a named decoder."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from ..core.paths import Path
from ..core.vocabulary import AbortCode, FinishCode, ReserveCode
from .records import ReservationRecord

log = logging.getLogger("coordinator.store.tree")


@dataclass(frozen=True)
class Held:
    """A reservation that succeeded."""

    now_ms: int
    expired: list[tuple[str, ReservationRecord]]
    """Reservations of this tree whose lease expired: (reservation id, record)."""
    rung: int = 0
    """The model ladder's rung it holds (1: the requested model), 0 without a ladder."""


@dataclass(frozen=True)
class Replayed:
    """A keyed call id that already finished (in an earlier delivery of the same work)."""

    outcome: str
    now_ms: int


@dataclass(frozen=True)
class Refused:
    """A reservation refused at ``level`` (0-based index into the path)."""

    level: int
    reason: str
    detail: str
    stopped: bool
    """True when the level is stopped for good; False when only this call did not fit."""
    now_ms: int
    expired: list[tuple[str, ReservationRecord]] = field(default_factory=list)
    """Reservations of this tree whose lease expired (when only this call did not fit:
    their holds may be what left no room)."""


@dataclass(frozen=True)
class Stop:
    """A level that a settle or release stopped."""

    ctx_id: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Finished:
    """What settle.lua or release.lua did with a reservation: ``finished`` it; found it
    ``already`` finished (nothing changed); found a counter on the path ``corrupt``
    (nothing charged, the reservation still held, the level stopped); or found it never
    held here (lost in a failover): ``orphan_charged`` to the path all the same, or
    ``orphan_recorded`` only (the path does not exist here either). An orphan is also a
    SettleOrphaned event on the tree's ledger stream and channel."""

    outcome: Literal["finished", "already", "corrupt", "orphan_charged", "orphan_recorded"]
    stops: list[Stop]
    """The levels this call stopped."""

    @property
    def orphan(self) -> bool:
        return self.outcome.startswith("orphan")


_FINISH_OUTCOMES: dict[int, Literal["finished", "already", "corrupt", "orphan_charged",
                                    "orphan_recorded"]] = {
    FinishCode.ALREADY: "already", FinishCode.FINISHED: "finished",
    FinishCode.CORRUPT: "corrupt", FinishCode.ORPHAN_CHARGED: "orphan_charged",
    FinishCode.ORPHAN_RECORDED: "orphan_recorded"}


@dataclass(frozen=True)
class AbortReply:
    """What abort.lua did: ``stopped`` it; found it ``already`` stopped or closed
    (``status`` says which reason or state); a timeout came ``early`` by Redis time
    (retry in ``wait_ms``); or the context is ``missing``."""

    outcome: Literal["stopped", "already", "early", "missing"]
    status: str | None = None
    wait_ms: int = 0


class State(NamedTuple):
    """A context's state as read in one round trip."""

    hashes: list[dict[str, str]]
    """The context hash of every level of the path, root first."""
    node_json: list[str]
    event_json: list[str]
    now_ms: int
    """Redis time."""


def decode_reserve(reply: list[Any]) -> Held | Refused | Replayed:
    """reserve.lua's reply (see its contract)."""
    if reply[0] == ReserveCode.REPLAYED:
        return Replayed(str(reply[2]), int(reply[1]))
    if reply[0] == ReserveCode.HELD:
        return Held(int(reply[1]), _expired(reply, 3), int(reply[2]))
    return Refused(int(reply[1]) - 1, str(reply[2]), str(reply[3]), bool(reply[4]),
                   int(reply[5]), _expired(reply, 6))


def _expired(reply: list[Any], start: int) -> list[tuple[str, ReservationRecord]]:
    """The (reservation id, record) pairs of a reply from index ``start`` on."""
    return [(str(reply[i]), ReservationRecord.from_json(reply[i + 1]))
            for i in range(start, len(reply), 2)]


def decode_stops(path: Path, reply: list[Any]) -> list[Stop]:
    """The levels of ``path`` a script stopped: ``reply[1:]`` as (level, reason,
    detail) triples (settle.lua, release.lua, propagate.lua)."""
    return [Stop(path.ids[int(reply[i]) - 1], str(reply[i + 1]), str(reply[i + 2]))
            for i in range(1, len(reply), 3)]


def decode_finish(path: Path, reply: list[Any]) -> Finished:
    """settle.lua's and release.lua's reply (see their contracts): the outcome by its
    code, and the levels of ``path`` the call stopped."""
    return Finished(_FINISH_OUTCOMES[int(reply[0])], decode_stops(path, reply))


def note_finish(kind: str, reservation_id: str, path: Path, reply: Any) -> Finished | None:
    """Decode a settle's or release's reply and log an orphan (the script recorded it
    with an event): what the wire calls on each write-behind reply it acknowledges."""
    if isinstance(reply, Exception):
        return None
    finished = decode_finish(path, reply)
    if finished.orphan:
        log.warning("%s %s found no reservation (lost in a failover?): %s", kind,
                    reservation_id, "charged to its path"
                    if finished.outcome == "orphan_charged" else "not charged")
    return finished


def decode_abort(reply: list[Any]) -> AbortReply:
    """abort.lua's reply."""
    code = int(reply[0])
    if code == AbortCode.STOPPED:
        return AbortReply("stopped")
    if code == AbortCode.ALREADY:
        return AbortReply("already", str(reply[1]) if len(reply) > 1 else None)
    if code == AbortCode.EARLY:
        return AbortReply("early", wait_ms=int(reply[1]))
    return AbortReply("missing")


def decode_close(reply: list[Any]) -> int:
    """close.lua's reply: micro-USD settled in the closed context's subtree when this
    close was its first (0 when it was closed before, or does not exist)."""
    return int(reply[2]) if reply[0] == 1 and int(reply[3]) == 1 else 0
