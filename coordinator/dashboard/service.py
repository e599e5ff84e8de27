"""What the pages and the JSON API show, built from the Redis views: overview pages, a
whole tree, spend, shield state; and the operator's abort through the public API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..context.execution import ExecutionContext
from ..errors import ContextNotFoundError
from ..models import Decision, SafetyEvent
from ..runtime.coordinator import Coordinator
from ..store.dashboard_reads import DashboardReads
from .model import LABELS, ROW_FIELDS, SORTS, parse_scope, row_from_hash

T = TypeVar("T")
MAX_PAGE = 200
MAX_CONTEXTS = 500
RECENT = 50
SPEND_LABELS = ("org", "team", "service", "provider")


class UnknownTenantError(LookupError):
    """A tenant this dashboard does not serve."""


class NotRunningError(Exception):
    """The context to abort is already stopped or closed (nothing is changed)."""


class _Cache:
    """Results of identical reads within ``ttl_s`` are shared: fifty pages showing the
    same view cost Redis one read, not fifty (pages refresh once more ``ttl_s`` after an
    event, so they never keep a read older than it). ``clear`` (after an action) drops
    them, and a read that was under way when it was called is not kept."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._data: dict[tuple[Any, ...], tuple[float, int, Any]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._data = {}

    def get(self, key: tuple[Any, ...], read: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._data.get(key)
            generation = self._generation
        if hit is not None and hit[0] > now and hit[1] == generation:
            value: T = hit[2]
            return value
        value = read()
        with self._lock:
            if generation == self._generation and self.ttl_s > 0:
                if len(self._data) > 1000:
                    self._data = {k: v for k, v in self._data.items() if v[0] > now}
                self._data[key] = (now + self.ttl_s, generation, value)
        return value


class Service:
    """The dashboard's data, per tenant (each tenant: its coordinator and views)."""

    def __init__(self, coordinators: Mapping[str, Coordinator], cache_s: float = 0.25) -> None:
        self.coordinators = dict(coordinators)
        self.views = {t: DashboardReads(c.client, c.keyspace, ROW_FIELDS)
                      for t, c in self.coordinators.items()}
        self.cache = _Cache(cache_s)

    @property
    def tenants(self) -> list[str]:
        return list(self.coordinators)

    def _views(self, tenant: str) -> DashboardReads:
        try:
            return self.views[tenant]
        except KeyError:
            raise UnknownTenantError(tenant) from None

    # -- reads ---------------------------------------------------------------------------

    def trees(self, tenant: str, *, sort: str = "spend", label: str | None = None,
              page: int = 1, size: int = 50) -> dict[str, Any]:
        """One page of open trees. Raises ValueError for a bad sort, filter or page."""
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}")
        if not (1 <= size <= MAX_PAGE) or page < 1 or page > 1_000_000:
            raise ValueError(f"size must be 1..{MAX_PAGE} and page >= 1")
        scope = parse_scope(label)
        views = self._views(tenant)
        key = ("trees", tenant, sort, label, page, size)

        def read() -> dict[str, Any]:
            p = views.page(sort, f"{scope[0]}={scope[1]}" if scope else None,
                           (page - 1) * size, size)
            rows = []
            for root, h, rate in zip(p.roots, p.hashes, p.rates, strict=True):
                row = row_from_hash(h, p.now_ms, rate)
                rows.append(row.as_json() if row is not None else
                            {"id": root, "status": "expired", "labels": {}})
            return {"tenant": tenant, "sort": sort, "label": label, "page": page,
                    "size": size, "total": p.total, "trees": rows, "now_ms": p.now_ms}

        return self.cache.get(key, read)

    def tree(self, tenant: str, ctx_id: str) -> dict[str, Any]:
        """The whole tree holding ``ctx_id``. Raises ContextNotFoundError."""
        views = self._views(tenant)
        return self.cache.get(("tree", tenant, ctx_id), lambda: self._tree(views, ctx_id))

    def _tree(self, views: DashboardReads, ctx_id: str) -> dict[str, Any]:
        root = views.locate(ctx_id)
        if root is None:
            raise ContextNotFoundError(ctx_id)
        read = views.tree(root, max_contexts=MAX_CONTEXTS, recent=RECENT)
        if not read.hashes.get(root):
            raise ContextNotFoundError(ctx_id)
        rate = views.rate(root)
        contexts: dict[str, dict[str, Any]] = {}

        def walk(cid: str, inherited: tuple[str, str | None, str | None] | None,
                 closed_above: bool = False) -> None:
            h = read.hashes.get(cid) or {}
            row = row_from_hash(h, read.now_ms, rate if cid == root else 0.0)
            if row is None:
                contexts[cid] = {"id": cid, "status": "expired", "children": []}
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
            data["tokens_by_provider"] = _tokens_by_provider(h)
            data["task"] = _task_of(h.get("meta"))
            data["children"] = read.children.get(cid, [])
            contexts[cid] = data
            for kid in data["children"]:
                walk(kid, inherited, closed_above)

        walk(root, None)
        tokens = contexts[root].get("tokens_by_provider", {})
        return {"root": root, "focus": ctx_id, "contexts": contexts,
                "truncated": read.truncated, "tokens_by_provider": tokens,
                "nodes": [_node(cid, j) for _, cid, j in read.nodes],
                "events": [_event(cid, j) for _, cid, j in read.events],
                "now_ms": read.now_ms}

    def spend(self, tenant: str, day: str | None = None) -> dict[str, Any]:
        """Spend by org, team, service (micro-USD: closed that day, open now) and tokens
        by provider.direction (closed that day, open now)."""
        day = day or time.strftime("%Y-%m-%d", time.gmtime())
        try:
            datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise ValueError("day must be YYYY-MM-DD") from None
        views = self._views(tenant)
        raw = self.cache.get(("spend", tenant, day), lambda: views.spend(day, SPEND_LABELS))
        out: dict[str, Any] = {"tenant": tenant, "day": day, "rows": []}
        for label, parts in raw.items():
            for value in sorted(set(parts["closed"]) | set(parts["open"])):
                closed, open_ = parts["closed"].get(value, 0), parts["open"].get(value, 0)
                unit = "tokens" if label == "provider" else "usd"
                scale = 1 if unit == "tokens" else 1e6
                out["rows"].append({"label": label, "value": value, "unit": unit,
                                    "closed": closed / scale, "open": open_ / scale})
        return out

    def shield(self, tenant: str) -> dict[str, Any]:
        views = self._views(tenant)
        breakers, windows, now = self.cache.get(("shield", tenant), views.shield)
        return {
            "tenant": tenant, "now_ms": now,
            "breakers": [{"name": _tag(key, "brk:"), "state": h.get("state", "CLOSED"),
                          "failures": int(h.get("failures") or 0),
                          "probe_holder": h.get("probe") or None,
                          "opened_ms": int(h.get("opened_ms") or 0) or None}
                         for key, h in breakers],
            "windows": [{"name": _tag(key, "win:"), "calls": calls, "usd": micro / 1e6}
                        for key, calls, micro in windows],
        }

    def health(self) -> dict[str, bool]:
        return {t: v.ping() for t, v in self.views.items()}

    # -- actions -------------------------------------------------------------------------

    def abort(self, tenant: str, ctx_id: str, reason: str, actor: str, role: str) -> str:
        """Abort a context and its subtree through the public API, recording a
        SafetyEvent that names the actor and the reason. Returns the resulting status."""
        coord = self.coordinators.get(tenant)
        if coord is None:
            raise UnknownTenantError(tenant)
        views = self._views(tenant)
        root = views.locate(ctx_id)
        h = views.context(root, ctx_id) if root else {}
        if root is None or not h.get("path"):
            raise ContextNotFoundError(ctx_id)
        if h.get("status") != "running":
            why = h.get("reason") or h.get("status")
            raise NotRunningError(f"{ctx_id} is already {h.get('status')} ({why}); "
                                  "nothing changed")
        path = tuple(h["path"].split(","))
        token = coord.token_codec().encode(root=root, path=path, tenant=coord.tenant, ttl_s=60,
                                   now=coord.redis_now_ms() / 1000)
        ctx = ExecutionContext.attach(token, coordinator=coord)
        try:
            ctx.record_event(SafetyEvent(
                event_type="operator_abort", decision=Decision.HALT, hook="dashboard",
                reason=f"{actor} aborted {ctx_id}: {reason}",
                metadata={"chain_id": ctx_id, "actor": actor, "role": role, "reason": reason}))
            ctx.abort(f"{reason} (by {actor} via dashboard)")
        finally:
            ctx.close()  # an attached handle: flushes, never closes the context
        self.cache.clear()
        return "aborted"


def _tag(key: str, kind: str) -> str:
    start = key.find("{" + kind)
    return key[start + 1 + len(kind): key.find("}", start)] if start >= 0 else key


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
    started = (datetime.fromtimestamp(start, tz=timezone.utc).isoformat()
               if start is not None else None)
    return {"context": ctx_id, "node_id": n.get("node_id"), "kind": n.get("kind"),
            "operation": n.get("operation_name") or "", "model": n.get("model"),
            "provider": n.get("provider"), "cost_usd": n.get("cost_usd", 0.0),
            "input_tokens": n.get("input_tokens", 0), "output_tokens": n.get("output_tokens", 0),
            "duration_ms": duration, "status": n.get("status"), "start": started}


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
    if isinstance(ts, (int, float)):
        ts = datetime.fromtimestamp(ts / 1000, tz=timezone.utc).isoformat(timespec="seconds")
    meta = e.get("metadata") if isinstance(e.get("metadata"), dict) else {}
    return {"context": ctx_id, "event_type": e.get("event_type"), "decision": e.get("decision"),
            "reason": e.get("reason"), "hook": e.get("hook"), "ts": ts,
            "actor": meta.get("actor")}


__all__ = ["LABELS", "NotRunningError", "Service", "UnknownTenantError"]
