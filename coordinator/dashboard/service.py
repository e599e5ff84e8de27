"""What the pages and the JSON API show, built from the Redis views: overview pages, a
whole tree, spend, shield state; and the operator's abort through the public API."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..context.execution import ExecutionContext
from ..core.labels import LABELS
from ..core.paths import stored_ids
from ..core.vocabulary import CEILING_REASONS
from ..errors import ContextNotFoundError
from ..models import Decision, SafetyEvent
from ..runtime.coordinator import Coordinator
from ..store.dashboard_fresh import unindexed_new
from ..store.dashboard_reads import DashboardReads
from ..store.dashboard_series import DashboardSeries
from ..store.model_spend import MODEL
from ..store.views import TOTAL
from .listing import fresh_rows, page_rows
from .model import ROW_FIELDS, SORTS, parse_scope, row_from_hash, sort_scores
from .tree_view import tree_view
from .waiting import Wait, open_waits

T = TypeVar("T")
MAX_PAGE = 200
MAX_CONTEXTS = 500
RECENT = 50
SPEND_LABELS = ("org", "team", "service", "provider", MODEL)
DAYS = 14
"""The Spend page's chart covers this many days."""


class UnknownTenantError(LookupError):
    """A tenant this dashboard does not serve."""


STATES = (None, "waiting")
"""The overview's state filters: none, or the trees waiting for approval."""


class NotRunningError(Exception):
    """The context to abort is closed, or already stopped otherwise than by a ceiling
    (aborted, timed out...): nothing is changed."""


class _Cache:
    """Results of identical reads within ``ttl_s`` are shared: fifty pages showing the
    same view cost Redis one read, not fifty. A page refreshing after a live event asks
    for a read begun after the event (``since``), so it never gets a shared read older
    than what it was told of. ``clear`` (after an action) drops them, and a read that
    was under way when it was called is not kept."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._data: dict[tuple[Any, ...], tuple[float, int, Any, float]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._data = {}

    def get(self, key: tuple[Any, ...], read: Callable[[], T],
            since: float | None = None) -> T:
        """The shared result of ``read`` (a read begun at or after ``since``, Unix ms)."""
        now, began = time.monotonic(), time.time() * 1000
        with self._lock:
            hit = self._data.get(key)
            generation = self._generation
        if (hit is not None and hit[0] > now and hit[1] == generation
                and (since is None or hit[3] >= since)):
            value: T = hit[2]
            return value
        value = read()
        with self._lock:
            if generation == self._generation and self.ttl_s > 0:
                if len(self._data) > 1000:
                    self._data = {k: v for k, v in self._data.items() if v[0] > now}
                self._data[key] = (now + self.ttl_s, generation, value, began)
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
              page: int = 1, size: int = 50, since: float | None = None,
              state: str | None = None) -> dict[str, Any]:
        """One page of open trees (``since``: a shared read is used only when it began at
        or after this Unix time, in ms; ``state="waiting"``: only the trees waiting for
        approval). Raises ValueError for a bad sort, filter, state or page."""
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}")
        if not (1 <= size <= MAX_PAGE) or page < 1 or page > 1_000_000:
            raise ValueError(f"size must be 1..{MAX_PAGE} and page >= 1")
        if state not in STATES:
            raise ValueError("state must be 'waiting' or none")
        scope = parse_scope(label)
        views = self._views(tenant)
        if state == "waiting":
            return self.cache.get(("waiting-trees", tenant, sort, label, page, size),
                                  lambda: self._waiting_page(tenant, sort, scope, page, size),
                                  since)
        key = ("trees", tenant, sort, label, page, size)

        def read() -> dict[str, Any]:
            index, offset = f"{scope[0]}={scope[1]}" if scope else None, (page - 1) * size
            fresh = []
            if not views.from_shards(sort, index, offset, size):
                # a tree opened since the indexer's last pass is listed at once
                found, now = unindexed_new(views.client, views.ks, ROW_FIELDS)
                fresh = fresh_rows(found, now, sort, scope)
            p = views.page(sort, index, offset, size, [root for _, root, _ in fresh])
            rows, total = page_rows(p, fresh, offset, size)
            series = DashboardSeries(views.client, views.ks).recent([r["id"] for r in rows])
            for row, points in zip(rows, series, strict=True):
                row["series"] = [list(pt) for pt in points]
            return {"tenant": tenant, "sort": sort, "label": label, "page": page,
                    "size": size, "total": total, "trees": rows, "now_ms": p.now_ms,
                    "state": None}

        return self.cache.get(key, read, since)

    def waiting(self, tenant: str) -> list[Wait]:
        """The open trees waiting for approval (the MAX_SCAN newest looked at)."""
        views = self._views(tenant)
        return list(self.cache.get(("waiting", tenant),
                                   lambda: open_waits(views.client, views.ks)[0]))

    def _waiting_page(self, tenant: str, sort: str, scope: tuple[str, str] | None,
                      page: int, size: int) -> dict[str, Any]:
        """The overview's page of trees waiting for approval, sorted as the others."""
        views = self._views(tenant)
        roots = [w.root for w in self.waiting(tenant)]
        hashes, now = views.root_hashes(roots)
        rates = views.client.hmget(views.ks.dash("rate"), roots) if roots else []
        rows = [r for h, rate in zip(hashes, rates, strict=True)
                if (r := row_from_hash(h, now, float(rate or 0))) is not None
                and r.waiting_for_approval is not None
                and (scope is None or r.labels.get(scope[0]) == scope[1])]
        rows.sort(key=lambda r: (sort_scores(r)[sort], r.id), reverse=True)
        shown = [r.as_json() for r in rows[(page - 1) * size:page * size]]
        series = DashboardSeries(views.client, views.ks).recent([r["id"] for r in shown])
        for data, points in zip(shown, series, strict=True):
            data["series"] = [list(pt) for pt in points]
        label = f"{scope[0]}={scope[1]}" if scope else None
        return {"tenant": tenant, "sort": sort, "label": label, "page": page, "size": size,
                "total": len(rows), "trees": shown, "now_ms": now, "state": "waiting"}

    def tree(self, tenant: str, ctx_id: str, since: float | None = None) -> dict[str, Any]:
        """The whole tree holding ``ctx_id`` (``since``: as for :meth:`trees`). Raises
        ContextNotFoundError."""
        views = self._views(tenant)
        return self.cache.get(("tree", tenant, ctx_id), lambda: self._tree(views, ctx_id),
                              since)

    def _tree(self, views: DashboardReads, ctx_id: str) -> dict[str, Any]:
        root = views.locate(ctx_id)
        if root is None:
            raise ContextNotFoundError(ctx_id)
        read = views.tree(root, max_contexts=MAX_CONTEXTS, recent=RECENT)
        if not read.hashes.get(root):
            raise ContextNotFoundError(ctx_id)
        series = DashboardSeries(views.client, views.ks).tree(root)
        return tree_view(read, ctx_id, views.rate(root), series)

    def spend(self, tenant: str, day: str | None = None, by: str = "team") -> dict[str, Any]:
        """The total and the unlabelled trees' spend, spend by org, team, service (USD:
        closed that day, open now), tokens by provider.direction (closed that day, open
        now), by provider|model (closed that day), and the closed spend of the DAYS days up
        to ``day`` by the label ``by``."""
        day = day or time.strftime("%Y-%m-%d", time.gmtime())
        try:
            last = datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise ValueError("day must be YYYY-MM-DD") from None
        if by not in SPEND_LABELS[:3]:
            raise ValueError(f"by must be one of {', '.join(SPEND_LABELS[:3])}")
        views = self._views(tenant)
        days = [(last - timedelta(days=n)).strftime("%Y-%m-%d") for n in range(DAYS - 1, -1, -1)]
        series = DashboardSeries(views.client, views.ks)

        def read() -> tuple[Any, ...]:
            return (views.spend(day, (*SPEND_LABELS, TOTAL)),
                    series.closed_by_day(by, days), series.closed_by_day(TOTAL, days))

        raw, by_day, totals = self.cache.get(("spend", tenant, day, by), read)
        whole = raw[TOTAL]  # (a shared read: never changed in place)
        out: dict[str, Any] = {
            "tenant": tenant, "day": day, "rows": [], "by": by,
            "total": {"closed": whole["closed"].get("all", 0) / 1e6,
                      "open": whole["open"].get("all", 0) / 1e6},
            "unlabelled": {"closed": whole["closed"].get("unlabelled", 0) / 1e6,
                           "open": whole["open"].get("unlabelled", 0) / 1e6},
            "days": [{"day": d, "total": totals[d].get("all", 0) / 1e6,
                      "unlabelled": totals[d].get("unlabelled", 0) / 1e6,
                      "by": {v: u / 1e6 for v, u in by_day[d].items()}} for d in days]}
        for label, parts in raw.items():
            if label == TOTAL:
                continue
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
        SafetyEvent that names the actor and the reason. Returns the resulting status. A
        context a ceiling stopped is aborted too (abort.lua replaces that stop, so a later
        raise cannot lift it), as ``budgetctl abort`` does; NotRunningError otherwise when
        it is not running."""
        coord = self.coordinators.get(tenant)
        if coord is None:
            raise UnknownTenantError(tenant)
        views = self._views(tenant)
        root = views.locate(ctx_id)
        h = views.context(root, ctx_id) if root else {}
        if root is None or not h.get("id"):
            raise ContextNotFoundError(ctx_id)
        if not abortable(h.get("status"), h.get("reason")):
            why = h.get("reason") or h.get("status")
            raise NotRunningError(f"{ctx_id} is already {h.get('status')} ({why}); "
                                  "nothing changed")
        path = stored_ids(h, root, ctx_id)
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


def abortable(status: str | None, reason: str | None) -> bool:
    """Whether an abort changes a context of this status and stop reason: a running one,
    or one a ceiling stopped (its stop becomes ``aborted``)."""
    return status == "running" or (status == "stopped" and reason in CEILING_REASONS)


def _tag(key: str, kind: str) -> str:
    start = key.find("{" + kind)
    return key[start + 1 + len(kind): key.find("}", start)] if start >= 0 else key


__all__ = ["LABELS", "NotRunningError", "Service", "UnknownTenantError"]
