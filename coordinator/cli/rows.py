"""What budgetctl shows of a context, read from its hash: pure logic, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..core.durations import human_age
from ..core.snapshots import call_counts, refusal_text
from ..core.vocabulary import CallCount, StopReason
from ..store.approval import approval_of


def usd(micro: int) -> str:
    """Micro-USD as dollars for a person: ``$0.0212``."""
    return f"${micro / 1e6:.4f}"


def plural(n: int, word: str) -> str:
    """``1 call``, ``2 calls``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def age(ms: int) -> str:
    """A duration for a person: ``42s``, ``3m05s``, ``2h07m``, ``3d04h`` (the
    dashboard's format too)."""
    return human_age(ms)


@dataclass(frozen=True)
class Stop:
    """Why a context halts: the context that was stopped (itself or an ancestor), the
    stop reason (``aborted``, ``timeout``, ``budget_exceeded``, ...) and its detail (an
    abort's reason text, the limit that was reached)."""

    by: str
    reason: str
    detail: str
    at_ms: int
    """When (Redis time; for an unrecorded timeout, the deadline)."""
    recorded: bool = True
    """False for a deadline that has passed in Redis time but that no process has
    recorded yet (the next reserve under it records it)."""

    def text(self, own_id: str) -> str:
        """``aborted (ops said so)``, or ``aborted at <ancestor> (ops said so)``."""
        where = "" if self.by == own_id else f" at {self.by}"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.reason}{where}{detail}"

    def as_json(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "detail": self.detail,
                "at_ms": self.at_ms, "recorded": self.recorded}


@dataclass(frozen=True)
class Waiting:
    """A tree waiting for approval: a call of context ``ctx`` met ``reason`` and waits,
    until ``until_ms`` (Redis time) at most, for an operator to raise the limit."""

    ctx: str
    reason: str
    until_ms: int
    left_ms: int

    def text(self, own_id: str) -> str:
        """``waiting for approval: budget_exceeded at <ctx> (4m12s left)``."""
        where = "" if self.ctx == own_id else f" at {self.ctx}"
        return f"waiting for approval: {self.reason}{where} ({age(self.left_ms)} left)"

    def as_json(self) -> dict[str, Any]:
        return {"ctx": self.ctx, "reason": self.reason, "until_ms": self.until_ms}


def waiting_of(h: dict[str, str], now_ms: int) -> Waiting | None:
    """The wait for approval a root's hash shows at Redis time ``now_ms`` (None: none)."""
    wait = approval_of(h, now_ms)
    if wait is None:
        return None
    until = int(wait["approval_until_ms"])
    return Waiting(str(wait["approval_ctx"]), str(wait["approval_reason"]), until,
                   until - now_ms)


@dataclass(frozen=True)
class Row:
    """One context as budgetctl shows it."""

    id: str
    name: str
    status: str
    """As recorded: ``running``, ``stopped`` or ``closed`` (``expired``: keys gone)."""
    used: int
    held: int
    limit: int
    calls: int
    created_ms: int
    stop: Stop | None
    """Its own stop or the nearest stopped ancestor's (None: nothing above stopped)."""
    outcomes: dict[str, int] = field(default_factory=dict)
    """Calls by outcome (snapshot ``calls``: run ones subtree included, ``refused`` its own)."""
    refusals: dict[str, int] = field(default_factory=dict)
    """Its refused calls by reason."""
    last_refusal: str | None = None
    waiting: Waiting | None = None
    """The tree's wait for approval (a root's row only): a call waits for an operator."""
    degraded: int = 0
    """Calls its model ladder ran on a cheaper model, subtree included (``nd``)."""

    @property
    def fraction(self) -> float:
        """Settled spend over the ceiling (0 without one)."""
        return self.used / self.limit if self.limit else 0.0

    @property
    def refused(self) -> int:
        """Its calls refused before they ran."""
        return self.outcomes.get(CallCount.REFUSED, 0)

    def refusal_text(self) -> str:
        """``3 refused: budget_exceeded`` ('' when none was refused)."""
        return refusal_text(self.refused, self.refusals, self.last_refusal)

    @property
    def state(self) -> str:
        """The status a person should read: a running context under a stop is halted;
        its refusals follow (``running, 3 refused: budget_exceeded``)."""
        wait = f"{self.waiting.text(self.id)}; " if self.waiting else ""
        return wait + self._stop_state()

    def _stop_state(self) -> str:
        refused = self.refusal_text()
        refused = f", {refused}" if refused else ""
        if self.stop is None:
            return f"{self.status}{refused}"
        if self.status == "stopped":
            return f"stopped: {self.stop.text(self.id)}{refused}"
        if self.status == "running":
            return f"halted: {self.stop.text(self.id)}{refused}"
        return f"{self.status}; halted: {self.stop.text(self.id)}{refused}"

    def as_json(self, now_ms: int) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "status": self.status,
            "halted": self.stop is not None,
            "stop": self.stop.as_json() if self.stop else None,
            "spent_usd": self.used / 1e6, "reserved_usd": self.held / 1e6,
            "limit_usd": self.limit / 1e6, "fraction": round(self.fraction, 6),
            "calls": self.calls, "calls_refused": self.refused,
            "call_outcomes": dict(self.outcomes), "refusals": dict(self.refusals),
            "last_refusal": self.last_refusal, "degraded_calls": self.degraded,
            "created_ms": self.created_ms,
            "age_s": max(0, now_ms - self.created_ms) // 1000 if self.created_ms else None,
            "waiting_for_approval": self.waiting.as_json() if self.waiting else None,
        }


def _int(h: dict[str, str], key: str) -> int:
    return int(h.get(key) or 0)


def own_stop(cid: str, h: dict[str, str], now_ms: int) -> Stop | None:
    """The stop recorded on this context, or its deadline passed but not yet recorded."""
    if h.get("status") == "stopped":
        return Stop(cid, h.get("reason") or "stopped", h.get("detail") or "",
                    _int(h, "stopped_ms"))
    deadline = _int(h, "deadline")
    if h.get("status") == "running" and deadline and now_ms >= deadline:
        return Stop(cid, StopReason.TIMEOUT, f"deadline passed {age(now_ms - deadline)} ago",
                    deadline, recorded=False)
    return None


def row(cid: str, h: dict[str, str], above: Stop | None, now_ms: int) -> Row:
    """The row of context ``cid`` whose hash is ``h`` ({} when its keys are gone); ``above``
    is the nearest stop among its ancestors."""
    if not h:
        return Row(cid, "context", "expired", 0, 0, 0, 0, 0, above)
    try:
        meta = json.loads(h.get("meta") or "{}")
    except ValueError:
        meta = {}
    name = str(meta.get("service") or "context") if isinstance(meta, dict) else "context"
    stop = own_stop(cid, h, now_ms)
    if h.get("status") != "stopped" and above is not None:
        stop = above
    closed_ms = _int(h, "closed_ms")
    if stop is not None and closed_ms and stop.by != cid and closed_ms <= stop.at_ms:
        stop = None  # it closed before the stop above it: nothing of it was halted
    counts = call_counts(h)
    outcomes = counts["calls"]
    runs = sum(n for k, n in outcomes.items() if k != CallCount.REFUSED)
    # calls run, subtree included (a tree written before they were counted: its steps)
    return Row(cid, name, h.get("status", "?"), _int(h, "u:usd"), _int(h, "h:usd"),
               _int(h, "l:usd"), max(runs, _int(h, "u:steps")), _int(h, "created_ms"), stop,
               outcomes, counts["refusals"], counts["last_refusal"], waiting_of(h, now_ms),
               counts["degraded_calls"])


@dataclass
class Node:
    """A context and the children shown under it (``more``: children not shown)."""

    row: Row
    children: list[Node] = field(default_factory=list)
    more: int = 0

    def as_json(self, now_ms: int) -> dict[str, Any]:
        return {**self.row.as_json(now_ms),
                "children": [c.as_json(now_ms) for c in self.children],
                "more_children": self.more}
