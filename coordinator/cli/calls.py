"""The newest calls of a tree that ``budgetctl tree`` lists under it: the node records of
the contexts read, newest first, as the dashboard's tree page reads them
(store/recent_entries.py). A call shows the model that ran, ``gpt-4o-mini (from gpt-4o)``
when its model ladder chose a cheaper one; a run of the same refusal in one context is
one line with its count."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..runtime.coordinator import Coordinator
from ..store.recent_entries import entry_ms, newest_entries
from .events import iso_second
from .rows import usd

DEFAULT_CALLS = 10
"""Calls listed by default (``--calls N``)."""


def model_text(model: str | None, degraded_from: str | None) -> str:
    """``gpt-4o``, or ``gpt-4o-mini (from gpt-4o)`` for a degraded call ('' when unnamed)."""
    if not model:
        return ""
    return f"{model} (from {degraded_from})" if degraded_from else model


@dataclass
class CallLine:
    """One recorded call (or a run of the same refusal in one context), newest first."""

    context: str
    node_id: str
    kind: str
    operation: str
    model: str | None
    degraded_from: str | None
    provider: str | None
    cost_micro: int
    input_tokens: int
    output_tokens: int
    status: str
    refused: str | None
    """The reason it was refused before it ran (``final_reserve``, ...), else None."""
    detail: str
    ts_ms: int | None
    count: int = 1

    def line(self) -> str:
        """``<when>  <ctx>  llm  answer  gpt-4o-mini (from gpt-4o)  $0.0008  1,000/1,000
        tokens  ok``, or ``<when>  <ctx>  llm  refused: final_reserve (x3)  <detail>``."""
        head = [iso_second(self.ts_ms) or "-", self.context, self.kind, self.operation]
        if self.refused:
            times = f" (x{self.count})" if self.count > 1 else ""
            detail = self.detail if self.detail != self.refused else ""
            rest = [f"refused: {self.refused}{times}", detail]
        else:
            tokens = (f"{self.input_tokens:,}/{self.output_tokens:,} tokens"
                      if self.input_tokens or self.output_tokens else "")
            rest = [model_text(self.model, self.degraded_from), usd(self.cost_micro), tokens,
                    self.status]
        return "  ".join(p for p in (*head, *rest) if p)

    def as_json(self) -> dict[str, Any]:
        return {"context": self.context, "node_id": self.node_id, "kind": self.kind,
                "operation": self.operation, "model": self.model,
                "degraded_from": self.degraded_from, "provider": self.provider,
                "cost_usd": self.cost_micro / 1e6, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "status": self.status,
                "refused": self.refused, "detail": self.detail, "ts_ms": self.ts_ms,
                "count": self.count}


def read_calls(coord: Coordinator, root: str, ctx_ids: Iterable[str], count: int
               ) -> list[CallLine]:
    """The ``count`` newest node records of the contexts ``ctx_ids`` of tree ``root``,
    newest first, runs of one refusal folded (two round trips, as the tree page)."""
    views = coord.views
    lists = [(cid, views.ks.nodes(root, cid)) for cid in ctx_ids]
    return fold([call_line(cid, text) for cid, text in
                 newest_entries(views.client, lists, count)])


def fold(calls: list[CallLine]) -> list[CallLine]:
    """Each run of the same refusal (context, reason, detail) in a row as one line."""
    out: list[CallLine] = []
    for c in calls:
        last = out[-1] if out else None
        if c.refused and last is not None and (last.context, last.refused, last.detail) == (
                c.context, c.refused, c.detail):
            last.count += 1
        else:
            out.append(c)
    return out


def call_line(ctx_id: str, text: str) -> CallLine:
    """One stored node record (JSON) as a line."""
    try:
        n = json.loads(text)
    except ValueError:
        n = None
    if not isinstance(n, dict):
        return CallLine(ctx_id, "", "?", "", None, None, None, 0, 0, 0, "unreadable", None,
                        "", None)
    return CallLine(
        ctx_id, _text(n.get("node_id")), _text(n.get("kind")) or "?",
        _text(n.get("operation_name")), _text(n.get("model")) or None,
        _text(n.get("degraded_from")) or None, _text(n.get("provider")) or None,
        round(_number(n.get("cost_usd")) * 1e6), int(_number(n.get("input_tokens"))),
        int(_number(n.get("output_tokens"))), _text(n.get("status")) or "?",
        _text(n.get("stop_reason")) or None, _text(n.get("stop_detail")),
        entry_ms(text) or None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value)
