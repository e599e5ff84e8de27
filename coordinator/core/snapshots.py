"""Reading a context's state back from Redis: snapshots and effective limits. Pure
functions over what the store returns (no Redis I/O here)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from ..errors import ContextNotFoundError
from ..models import (
    ChainMetadata,
    ContextSnapshot,
    Degrade,
    ExecutionConfig,
    LeasePolicy,
    NodeRecord,
    SafetyEvent,
)
from .amounts import micro_to_usd, ms_to_datetime, token_limits, token_totals
from .paths import Path
from .vocabulary import CallCount


def stored_metadata_json(metadata: ChainMetadata) -> str:
    """The metadata as a context's hash keeps it: compact JSON of the fields set, without
    the ids the hash has in fields of their own (``id``, ``request_id``). An unlabelled
    context's is ``{}``: every value of its hash stays under Redis' 64-byte listpack
    limit, which keeps the hash about half the size."""
    return metadata.model_dump_json(exclude_defaults=True,
                                    exclude={"chain_id", "request_id"})


def metadata_from_hash(h: dict[str, str]) -> ChainMetadata:
    """A context's ChainMetadata, read back from its hash (see stored_metadata_json)."""
    return ChainMetadata(**{"chain_id": h["id"], "request_id": h.get("request_id") or h["id"],
                            **json.loads(h.get("meta") or "{}")})


def config_from_hash(h: dict[str, str]) -> ExecutionConfig:
    """The effective limits of a context, read back from its hash. A lease policy is
    stored with only its fields that differ from their defaults: ``{}`` is a policy of
    default values, kept as one (no ``lease`` key: strict mode)."""
    requested = json.loads(h.get("config") or "{}")
    return ExecutionConfig.model_construct(
        max_cost_usd=micro_to_usd(int(h.get("l:usd") or 0)),
        max_steps=int(h.get("l:steps") or 0),
        max_retries_total=int(h.get("l:retries") or 0),
        timeout_ms=int(requested.get("timeout_ms") or 0),
        token_budget=None,
        deadline=ms_to_datetime(int(h.get("deadline") or 0)),
        lease=LeasePolicy(**requested["lease"]) if "lease" in requested else None,
        approval_wait_s=requested.get("approval_wait_s"),
        degrade=Degrade(**requested["degrade"]) if "degrade" in requested else None,
        final_reserve_usd=float(requested.get("final_reserve_usd") or 0.0),
        warn_at=tuple(requested.get("warn_at") or ()),
    )


def event_from_json(text: str) -> SafetyEvent:
    data = json.loads(text)
    ts = data.get("ts")
    if isinstance(ts, (int, float)):  # written by Lua in Redis ms
        data["ts"] = datetime.fromtimestamp(ts / 1000, tz=timezone.utc)
    if data.get("metadata") == []:  # cjson encodes an empty table as an array
        data["metadata"] = {}
    return SafetyEvent(**data)


def in_finishing_order(nodes: Iterable[NodeRecord]) -> list[NodeRecord]:
    """Node records by when their call finished. A thread's settles can land out of
    order (one sent by the flusher's connection, the next by the caller's own)."""
    return sorted(nodes, key=lambda n: n.end_ts or n.start_ts)


def build_snapshot(path: Path, hashes: list[dict[str, str]], node_json: list[str],
                    event_json: list[str], now_ms: int,
                    offline_events: list[SafetyEvent]) -> ContextSnapshot:
    h = hashes[-1]
    if not h:
        raise ContextNotFoundError(path.ctx_id)
    stopped_by = None
    reason = None
    for cid, level in zip(reversed(path.ids), reversed(hashes), strict=True):
        if level.get("status") == "stopped":
            stopped_by, reason = cid, level.get("reason")
            break
    status = h.get("status", "running")
    if status == "running" and stopped_by is not None:
        status = "stopped"
    if status == "running" and any(x.get("status") == "closed" for x in hashes[:-1]):
        status = "closed"
    created = int(h.get("created_ms") or now_ms)
    end = int(h.get("stopped_ms") or h.get("closed_ms") or now_ms)
    if stopped_by is not None and stopped_by != path.ctx_id:
        level = hashes[path.ids.index(stopped_by)]
        end = min(end, int(level.get("stopped_ms") or end))
    requested = json.loads(h.get("config") or "{}")
    clamped = [*requested.get("clamped", []),
               *[dim_name(d) for d in (h.get("clamped") or "").split(",") if d]]
    return ContextSnapshot(
        chain_id=path.ctx_id,
        request_id=h.get("request_id", ""),
        step_count=int(h.get("u:steps") or 0),
        cost_usd_accumulated=micro_to_usd(int(h.get("u:usd") or 0)),
        retries_used=int(h.get("u:retries") or 0),
        aborted=stopped_by is not None,
        abort_reason=reason,
        elapsed_ms=float(max(0, end - created)),
        nodes=in_finishing_order(NodeRecord(**json.loads(n)) for n in node_json),
        events=[*(event_from_json(e) for e in event_json), *offline_events],
        parent_chain_id=path.parent_id,
        root_chain_id=path.root,
        status=status,
        stopped_by=stopped_by,
        max_cost_usd=micro_to_usd(int(h.get("l:usd") or 0)),
        max_steps=int(h.get("l:steps") or 0),
        max_retries_total=int(h.get("l:retries") or 0),
        cost_usd_reserved=micro_to_usd(int(h.get("h:usd") or 0)),
        tokens=token_totals(h),
        token_limits=token_limits(h),
        deadline=ms_to_datetime(int(h.get("deadline") or 0)),
        clamped=clamped,
        depth=int(h.get("depth") or 0),
        metadata=metadata_from_hash(h) if h.get("meta") else None,
        **call_counts(h),
    )


CALL_OUTCOMES = tuple(c.value for c in CallCount)
"""The outcomes lib/calls_counted.lua's count_call counts on a context's hash (``n:<outcome>``)."""


def call_counts(h: dict[str, str]) -> dict[str, Any]:
    """The snapshot fields of the call counts on a context's hash: ``calls`` by outcome,
    ``refusals`` by reason, ``last_refusal``, ``unreported_calls``, ``degraded_calls``
    (``nd``, subtree included; absent fields are 0; an unreadable count reads 0, as the
    counters' views do)."""
    def num(field: str) -> int:
        value = h.get(field) or "0"
        return int(value) if value.isdigit() else 0
    calls = {k: n for k in CALL_OUTCOMES if (n := num(f"n:{k}"))}
    refusals = {f[3:]: n for f in h if f.startswith("nr:") and (n := num(f))}
    return {"calls": calls, "refusals": refusals, "last_refusal": h.get("nr_last") or None,
            "unreported_calls": num("n:unreported"), "degraded_calls": num("nd")}


def dim_name(dim: str) -> str:
    """Storage dimension -> user name (``openai.ttot`` -> ``openai.total``)."""
    names = {"ttot": "total", "tin": "input", "tout": "output", "usd": "max_cost_usd"}
    slug, _, base = dim.rpartition(".")
    name = names.get(base, base)
    return f"{slug}.{name}" if slug else name


def refusal_text(refused: int, refusals: dict[str, int], last: str | None) -> str:
    """``3 refused: budget_exceeded``, or with counts when the reasons differ
    (``3 refused: budget_exceeded 2, circuit_open 1; last circuit_open``); '' if none."""
    if not refused:
        return ""
    if len(refusals) <= 1:
        return f"{refused} refused: {last}" if last else f"{refused} refused"
    counts = ", ".join(f"{r} {n}" for r, n in sorted(refusals.items(), key=lambda x: -x[1]))
    return f"{refused} refused: {counts}; last {last}"
