"""``approval_needed`` alerts: one per waiting context and stop (the limit it waits on:
raised and reached again, it alerts again), for each tree waiting for approval
(dashboard/waiting.py), with the limit reached and a link to the tree page. Deduplicated
like the threshold alerts (the indexer claims each key in Redis, one process sends)."""

from __future__ import annotations

import os
from urllib.parse import quote, urlencode

from ..core.keys import KeySpace
from ..core.labels import labels_of
from ..store.topology import Client
from .model import Alert
from .waiting import limit_reached, open_waits

KIND = "approval_needed"


def dashboard_url(env: dict[str, str] | None = None) -> str:
    """``BUDGET_DASHBOARD_URL``: where operators open the dashboard (the alerts' links
    start with it; unset: the links are paths, ``/trees/<id>?tenant=``)."""
    return (dict(os.environ if env is None else env).get("BUDGET_DASHBOARD_URL") or "").rstrip("/")


def tree_link(base: str, tenant: str, ctx_id: str) -> str:
    """The tree page of ``ctx_id`` (focused on it)."""
    return f"{base}/trees/{quote(ctx_id, safe='')}?{urlencode({'tenant': tenant})}"


def approval_crossings(client: Client, ks: KeySpace, tenant: str, base: str) -> list[Alert]:
    """An alert for each tree waiting now: its root, the waiting context, the stop waited
    on and the limit reached (threshold ``approval_needed:<ctx>:<reason>:<limit>``)."""
    waits, now = open_waits(client, ks)
    if not waits:
        return []
    pipe = client.pipeline(transaction=False)
    for w in waits:
        pipe.hgetall(ks.ctx(w.root, w.ctx))
        pipe.hget(ks.ctx(w.root, w.root), "meta")
    res = pipe.execute()
    out = []
    for w, h, meta in zip(waits, res[0::2], res[1::2], strict=True):
        h = {str(k): str(v) for k, v in h.items()}
        limit = limit_reached(w.reason, h)
        ceiling = int(h["l:usd"]) / 1e6 if (h.get("l:usd") or "").isdigit() else None
        out.append(Alert(w.root, w.ctx, f"{KIND}:{w.ctx}:{w.reason}:{limit}", 1.0,
                         labels_of(meta), int(h.get("u:usd") or 0) / 1e6, ceiling, now,
                         reason=w.reason, limit=limit, link=tree_link(base, tenant, w.ctx)))
    return out
