"""A whole tree as the tree page and ``GET /api/trees/{id}`` show it, built from what the
store read: each context's row with the stop it inherits, children biggest spender
first (the first SHOWN_CHILDREN shown, the rest behind "N more"), bars scaled to the
root's ceiling, the newest calls and events of the whole tree, and its spend chart."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..core.paths import stored_ids
from ..core.snapshots import call_counts, refusal_text
from ..core.vocabulary import CallCount
from ..store.dashboard_reads import TreeRead
from .charts import spend_chart
from .model import row_from_hash

SHOWN_CHILDREN = 10
"""Children shown under a context; the others are behind "N more"."""
OPEN_DEPTH = 2
"""Contexts at this depth or deeper start collapsed (the focused one's path is open)."""


def tree_view(read: TreeRead, focus: str, rate: float,
              series: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The tree page's data (see the module docstring); ``rate``: the root's burn."""
    root = read.root
    contexts: dict[str, dict[str, Any]] = {}
    on_path = set(_path_of(read, focus))

    def walk(cid: str, inherited: tuple[str, str | None, str | None] | None,
             closed_above: bool = False) -> None:
        h = read.hashes.get(cid) or {}
        row = row_from_hash(h, read.now_ms, rate if cid == root else 0.0)
        if row is None:
            contexts[cid] = {"id": cid, "status": "expired", "children": [],
                             "shown": [], "more": [], "spend_usd": 0.0, "open": False}
            return
        data = row.as_json()
        if row.status == "stopped":
            inherited = (cid, row.reason, row.detail)
        elif inherited is not None:  # an ancestor's stop halts this one too
            data["status"] = "stopped"
            data["stopped_by"], data["reason"], data["detail"] = inherited
        elif closed_above and row.status == "running":  # as load_snapshot says
            data["status"] = "closed"
        closed_above = closed_above or row.status == "closed"
        counts = call_counts(h)
        outcomes = counts["calls"]
        data["calls_run"] = max(row.steps, sum(n for k, n in outcomes.items()
                                               if k != CallCount.REFUSED))
        data["refused_text"] = refusal_text(outcomes.get(CallCount.REFUSED, 0), counts["refusals"],
                                            counts["last_refusal"])
        data["degraded_calls"] = counts["degraded_calls"]
        data["tokens_by_provider"] = _tokens_by_provider(h)
        data["task"] = _task_of(h.get("meta"))
        data["open"] = row.depth < OPEN_DEPTH or cid in on_path
        contexts[cid] = data
        kids = read.children.get(cid, [])
        for kid in kids:
            walk(kid, inherited, closed_above)
        kids = sorted(kids, key=lambda k: (-contexts[k]["spend_usd"], k))
        shown = kids[:SHOWN_CHILDREN]
        shown += [k for k in kids[SHOWN_CHILDREN:] if k in on_path]
        data["children"] = kids
        data["shown"] = shown
        data["more"] = [k for k in kids if k not in shown]

    walk(root, None)
    top = contexts[root]
    scale = top.get("ceiling_usd") or top.get("spend_usd") or 1.0
    for c in contexts.values():
        c["bar"] = _bar(c, scale)
    h = read.hashes[root]
    stops = sorted((int(c.get("stopped_ms") or 0), cid, str(c.get("reason") or "stopped"))
                   for cid, c in read.hashes.items()
                   if c.get("status") == "stopped" and c.get("stopped_ms"))
    nodes = [_node(cid, j) for cid, j in read.nodes]
    events = [_event(cid, j) for cid, j in read.events]
    chart = spend_chart(series, created_ms=int(h.get("created_ms") or read.now_ms),
                        now_ms=_end_ms(h, read.now_ms), spend_micro=int(h.get("u:usd") or 0),
                        ceiling_micro=int(h.get("l:usd") or 0), stops=stops,
                        calls=[got for n in nodes if (got := _charged(n)) is not None])
    return {"root": root, "focus": focus, "contexts": contexts,
            "truncated": read.truncated, "tokens_by_provider": top.get("tokens_by_provider", {}),
            "nodes": nodes, "call_rows": fold_refusals(nodes),
            "events": events, "event_rows": fold_repeats(events),
            "chart": chart, "now_ms": read.now_ms}


def _end_ms(h: Mapping[str, str], now_ms: int) -> int:
    """Where a tree's chart ends: its close, else now."""
    return int(h.get("closed_ms") or 0) or now_ms


def _path_of(read: TreeRead, focus: str) -> list[str]:
    return list(stored_ids(read.hashes.get(focus) or {}, read.root, focus))


def _bar(c: Mapping[str, Any], scale: float) -> dict[str, float | None]:
    """Widths (percent) of spend and held against the root's ceiling ``scale``, and where
    the context's own ceiling falls when it is tighter (None: the root's)."""
    spend = min(100.0, 100 * (c.get("spend_usd") or 0) / scale)
    held = min(100.0 - spend, 100 * (c.get("held_usd") or 0) / scale)
    own = c.get("ceiling_usd")
    mark = 100 * own / scale if own and own < scale - 1e-9 else None
    return {"spend": round(spend, 2), "held": round(held, 2),
            "own": round(mark, 2) if mark is not None else None}


def _task_of(meta_json: str | None) -> dict[str, str] | None:
    """The Celery task a context runs (``@contained`` tags it ``celery_task``), and where
    when a ``celery_host`` tag says so; None for other contexts."""
    try:
        tags = json.loads(meta_json or "{}").get("tags") or {}
    except (ValueError, AttributeError):
        return None
    if not isinstance(tags, dict) or not tags.get("celery_task"):
        return None
    return {"name": str(tags["celery_task"]), "host": str(tags.get("celery_host") or ""),
            "retries": str(tags.get("celery_retries") or "0")}


def _tokens_by_provider(h: Mapping[str, str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for field, value in h.items():
        if field.startswith("u:") and "." in field and field.endswith(("tin", "tout")):
            provider, _, d = field[2:].rpartition(".")
            out.setdefault(provider, {"input": 0, "output": 0})[
                "input" if d == "tin" else "output"] = int(value)
    return out


def _node(ctx_id: str, text: str) -> dict[str, Any]:
    try:
        n = json.loads(text)
    except ValueError:
        return {"context": ctx_id, "status": "unreadable"}
    start, end = _seconds(n.get("start_ts")), _seconds(n.get("end_ts"))
    duration = (end - start) * 1000 if start is not None and end is not None else None
    return {"context": ctx_id, "node_id": n.get("node_id"), "kind": n.get("kind"),
            "refused": n.get("stop_reason") or None,
            "operation": n.get("operation_name") or "", "model": n.get("model"),
            "degraded_from": n.get("degraded_from") or None,
            "provider": n.get("provider"), "cost_usd": n.get("cost_usd", 0.0),
            "input_tokens": n.get("input_tokens", 0), "output_tokens": n.get("output_tokens", 0),
            "duration_ms": duration, "status": n.get("status"),
            "start": _iso(start), "start_ms": int(start * 1000) if start is not None else None}


def fold_refusals(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest calls (newest first) as the tree page lists them: the calls that ran,
    and the refused ones (they cost $0) folded by reason into one line where the newest
    of them is, ``{"fold": "37 refused: aborted", "count": 37, "contexts": 37, ...}``,
    so that a burst of refusals does not push the calls that cost money out of view."""
    rows: list[dict[str, Any]] = []
    folds: dict[str, tuple[dict[str, Any], set[str]]] = {}
    for n in nodes:
        reason = n.get("refused")
        if not reason:
            rows.append({**n, "fold": None, "count": 1})
            continue
        if reason not in folds:
            folds[reason] = ({"fold": "", "reason": reason, "count": 0,
                              "start_ms": n.get("start_ms")}, set())
            rows.append(folds[reason][0])
        fold, contexts = folds[reason]
        fold["count"] += 1
        contexts.add(str(n.get("context")))
    for fold, contexts in folds.values():
        fold["fold"] = f"{fold['count']} refused: {fold['reason']}"
        fold["contexts"] = len(contexts)
        fold["context"] = next(iter(contexts)) if len(contexts) == 1 else None
    return rows


def fold_repeats(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest events (newest first) as the tree page lists them: each run of the same
    event (type, decision, reason) in a row is one line, its newest, with ``count`` and
    ``contexts`` (one stop that 37 contexts recorded is one line)."""
    rows: list[dict[str, Any]] = []
    seen: list[set[str]] = []
    for e in events:
        last = rows[-1] if rows else None
        if last is not None and all(last.get(k) == e.get(k)
                                    for k in ("event_type", "decision", "reason")):
            last["count"] += 1
            seen[-1].add(str(e.get("context")))
            last["contexts"] = len(seen[-1])
            continue
        rows.append({**e, "count": 1, "contexts": 1})
        seen.append({str(e.get("context"))})
    return rows


def _charged(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """When a recorded call ended (ms) and what it cost (micro-USD); None: no time."""
    start, cost = node.get("start_ms"), node.get("cost_usd")
    if start is None or not isinstance(cost, (int, float)):
        return None
    return int(start + (node.get("duration_ms") or 0)), round(cost * 1e6)


def _seconds(value: Any) -> float | None:
    """A node timestamp (Unix seconds, or ISO text from a pydantic dump) as seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _event(ctx_id: str, text: str) -> dict[str, Any]:
    try:
        e = json.loads(text)
    except ValueError:
        return {"context": ctx_id, "event_type": "unreadable"}
    ts = e.get("ts")
    seconds = ts / 1000 if isinstance(ts, (int, float)) and not isinstance(ts, bool) \
        else _seconds(ts)
    meta = e.get("metadata") if isinstance(e.get("metadata"), dict) else {}
    return {"context": ctx_id, "event_type": e.get("event_type"), "decision": e.get("decision"),
            "reason": e.get("reason"), "hook": e.get("hook"), "ts": _iso(seconds),
            "ts_ms": int(seconds * 1000) if seconds is not None else None,
            "actor": meta.get("actor")}


def _iso(seconds: float | None) -> str | None:
    """One timestamp format everywhere: UTC to the second, ``2026-11-26T12:03:32Z``."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


