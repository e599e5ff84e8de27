"""The events of a tree that ``budgetctl tree`` lists under it: what operators did to it
(OPERATOR_EVENTS) and what the budget's edge did (EDGE_EVENTS: a call run on a cheaper
model, a warning threshold reached; the stops themselves are on each context's line),
among the newest SafetyEvents of every context read as the dashboard's tree page reads them
(store/recent_entries.py), a run of the same event folded into one line, a
``limits_changed`` said as who changed which limit from what to what and why."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..core.limit_text import limit_text
from ..core.vocabulary import EdgeEvent
from ..models_limits import LimitChange
from ..runtime.coordinator import Coordinator
from ..store.recent_entries import newest_entries

_ORDER = {"usd": 0, "steps": 1, "retries": 2}
"""How set_limits takes the limits; token limits after them, by name."""
OPERATOR_EVENTS = ("limits_changed", "operator_abort", "state_repaired")
"""The events listed (and any ``approval_*`` one): an operator's changes."""
EDGE_EVENTS = tuple(e.value for e in EdgeEvent)
"""Listed too: ``degraded`` (once per context and pair of models) and ``budget_warning``
(once per level and threshold); their reason says what happened."""
MAX_READ = 200
"""Events read, the newest of the whole tree (stops and refusals among them)."""
MAX_SHOWN = 10
"""Events listed at most, newest first."""


@dataclass
class EventLine:
    """One event (or a run of the same one) of a tree, newest first."""

    context: str
    event_type: str
    decision: str
    text: str
    """What happened, for a person (a limits_changed: who, each limit before -> after, why)."""
    ts_ms: int | None
    actor: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    count: int = 1

    def line(self) -> str:
        """``2026-11-28T11:02:03Z  <ctx>  limits_changed  by olga: ...`` (``x3``: repeats)."""
        when = iso_second(self.ts_ms) or "-"
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{when}  {self.context}  {self.event_type}{times}  {self.text}"

    def as_json(self) -> dict[str, Any]:
        return {"context": self.context, "event_type": self.event_type,
                "decision": self.decision, "text": self.text, "ts_ms": self.ts_ms,
                "actor": self.actor, "changes": self.changes, "count": self.count}


def read_events(coord: Coordinator, root: str, ctx_ids: Iterable[str]) -> list[EventLine]:
    """The operator and edge events among the MAX_READ newest events of the contexts
    ``ctx_ids`` of tree ``root``, newest first, repeats folded (two round trips, as the
    tree page)."""
    views = coord.views
    lists = [(cid, views.ks.events(root, cid)) for cid in ctx_ids]
    lines = [event_line(cid, text) for cid, text in
             newest_entries(views.client, lists, MAX_READ)]
    return fold([e for e in lines if e.event_type in (*OPERATOR_EVENTS, *EDGE_EVENTS)
                 or e.event_type.startswith("approval")])[:MAX_SHOWN]


def fold(events: list[EventLine]) -> list[EventLine]:
    """Each run of the same event of one context (type, decision, text) in a row as one
    line, its newest."""
    out: list[EventLine] = []
    for e in events:
        last = out[-1] if out else None
        if last is not None and (last.context, last.event_type, last.decision, last.text) == (
                e.context, e.event_type, e.decision, e.text):
            last.count += 1
        else:
            out.append(e)
    return out


def event_line(ctx_id: str, text: str) -> EventLine:
    """One stored SafetyEvent (JSON) as a line."""
    try:
        e = json.loads(text)
    except ValueError:
        e = None
    if not isinstance(e, dict):
        return EventLine(ctx_id, "unreadable", "", "", None)
    got = e.get("metadata")
    meta: dict[str, Any] = got if isinstance(got, dict) else {}
    actor = str(meta["actor"]) if meta.get("actor") else None
    event_type, reason = str(e.get("event_type") or "?"), str(e.get("reason") or "")
    line = EventLine(ctx_id, event_type, str(e.get("decision") or ""), reason,
                     _ms(e.get("ts")), actor)
    if event_type == "limits_changed" and isinstance(meta.get("limits"), dict):
        line.changes = _changes(meta["limits"])
        line.text = _limits_text(actor, line.changes, meta)
    return line


def _changes(limits: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for dim, pair in sorted(limits.items(), key=lambda kv: (_ORDER.get(kv[0], 3), kv[0])):
        if isinstance(pair, dict) and isinstance(pair.get("after"), int):
            before = pair.get("before")
            change = LimitChange.of(dim, before if isinstance(before, int) else None,
                                    pair["after"])
            out.append(change.model_dump())
    return out


def _limits_text(actor: str | None, changes: list[dict[str, Any]],
                 meta: Mapping[str, Any]) -> str:
    """``by olga: max_cost_usd $0.05 -> $0.10 (approved); lifted budget_exceeded``."""
    said = ", ".join(f"{c['limit']} {limit_text(c['limit'], c['before'])} -> "
                     f"{limit_text(c['limit'], c['after'])}" for c in changes)
    text = f"by {actor or '?'}: {said}"
    if meta.get("reason"):
        text += f" ({meta['reason']})"
    if meta.get("lifted"):
        text += f"; lifted {meta['lifted']}"
    if meta.get("stopped"):
        text += f"; stopped: {meta['stopped']}"
    return text


def _ms(ts: object) -> int | None:
    """An event's ``ts`` (ms as the scripts write it, ISO 8601 as pydantic does) in ms."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return int(ts)
    if isinstance(ts, str):
        try:
            return int(datetime.fromisoformat(ts).timestamp() * 1000)
        except ValueError:
            return None
    return None


def iso_second(ms: int | None) -> str | None:
    """``2026-11-28T11:02:03Z`` (None: no time)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
