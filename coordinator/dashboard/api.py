"""The JSON API (the pages are built on the same service calls), the server-sent event
stream, /healthz and /metrics."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..quotas import Quotas
from ..store.dashboard_reads import BACKEND_ERRORS
from . import limits_edit, quota_edit
from .live import Listener
from .metrics import CONTENT_TYPE, registry_for, render
from .runtime import Dashboard

MAX_WATCHED = 200
STATUS_EVERY_S = 0.5
"""A live stream says whether Redis answers at least this often."""
MAX_REASON = 500


def clean_reason(text: object) -> str:
    """An abort's or a limit change's reason: required, printable, at most MAX_REASON characters."""
    if text is not None and not isinstance(text, str):
        raise ValueError(f"the reason must be a string, got {type(text).__name__}")
    if text is None or not text.strip():
        raise ValueError("a reason is required")
    text = "".join(c for c in text.strip() if c.isprintable())
    if len(text) > MAX_REASON:
        raise ValueError(f"the reason is {len(text)} characters; at most {MAX_REASON}")
    return text


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer") from None


def trees_query(request: Request) -> dict[str, Any]:
    """The overview's query parameters (sort, label filter, state filter, page, size,
    since)."""
    return {"sort": request.query_params.get("sort", "spend"),
            "label": request.query_params.get("label") or None,
            "state": request.query_params.get("state") or None,
            "page": _int(request, "page", 1), "size": _int(request, "size", 50),
            "since": since_of(request)}


def since_of(request: Request) -> float | None:
    """``?since=`` (Unix ms, from a live event): the read must have begun after it."""
    raw = request.query_params.get("since")
    if raw is None:
        return None
    try:
        since = float(raw)
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        raise ValueError("since must be a number (Unix ms)")
    return since


def page_query(request: Request) -> dict[str, int]:
    """A list's page and size (default 1 and 50)."""
    return {"page": _int(request, "page", 1), "size": _int(request, "size", 50)}


def spend_csv_body(data: Mapping[str, Any]) -> str:
    """The spend table as CSV (day, label, value, unit, closed, open)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["day", "label", "value", "unit", "closed", "open"])
    for r in data["rows"]:
        value = str(r["value"])
        if value[:1] in ("=", "+", "-", "@"):  # a spreadsheet must not run a label
            value = "'" + value
        writer.writerow([data["day"], r["label"], value, r["unit"], r["closed"], r["open"]])
    for label in ("total", "unlabelled"):
        writer.writerow([data["day"], label, "", "usd", data[label]["closed"],
                         data[label]["open"]])
    return out.getvalue()


def api_routes(dash: Dashboard) -> list[Route]:
    svc = dash.service

    def trees(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(svc.trees(dash.tenant(request, who), **trees_query(request)))

    def tree(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(svc.tree(dash.tenant(request, who), request.path_params["id"],
                                     since_of(request)))

    async def abort(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        try:
            body = await request.json()
        except ValueError:
            raise ValueError("the body must be JSON: {\"reason\": \"...\"}") from None
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        dash.check_action(request, who, request.headers.get("x-csrf-token"))
        reason = clean_reason(body.get("reason"))
        status = await run_in_threadpool(svc.abort, tenant, request.path_params["id"], reason,
                                         who.name, who.role)
        return JSONResponse({"id": request.path_params["id"], "status": status,
                             "reason": reason, "by": who.name})

    async def limits(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        dash.check_action(request, who, request.headers.get("x-csrf-token"))
        try:
            body = await request.json()
        except ValueError:
            raise ValueError("the body must be JSON: {\"max_cost_usd\": \"2.00\", "
                             "\"reason\": \"...\"}") from None
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        changes = limits_edit.limits_from(body, also=("reason",))
        reason = clean_reason(body.get("reason"))
        done = await run_in_threadpool(limits_edit.change_limits, svc, tenant,
                                       request.path_params["id"], changes, reason, who.name)
        return JSONResponse({**done.model_dump(mode="json"), "by": who.name})

    def spend(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(svc.spend(dash.tenant(request, who), request.query_params.get("day"),
                                      request.query_params.get("by") or "team"))

    def spend_csv(request: Request) -> Response:
        who = dash.principal(request)
        data = svc.spend(dash.tenant(request, who), request.query_params.get("day"))
        return Response(spend_csv_body(data), media_type="text/csv", headers={
            "Content-Disposition": f'attachment; filename="spend-{data["day"]}.csv"'})

    def shield(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(svc.shield(dash.tenant(request, who)))

    def sessions(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(dash.sessions.page(dash.tenant(request, who),
                                               **page_query(request)))

    def quotas(request: Request) -> Response:
        who = dash.principal(request)
        return JSONResponse(Quotas(svc.coordinators[dash.tenant(request, who)]).overview())

    async def quota(request: Request) -> Response:
        who = dash.principal(request)
        coord = svc.coordinators[dash.tenant(request, who)]
        rule_id = request.path_params["id"]
        if request.method == "GET":
            return JSONResponse(await run_in_threadpool(Quotas(coord).report, rule_id))
        dash.check_action(request, who, request.headers.get("x-csrf-token"))
        if request.method == "DELETE":
            await run_in_threadpool(quota_edit.delete_rule, coord, rule_id, who.name)
            return JSONResponse({"deleted": rule_id, "by": who.name})
        try:
            body = await request.json()
        except ValueError:
            raise ValueError("the body must be JSON: {\"usd\": 500, ...}") from None
        rule = await run_in_threadpool(quota_edit.change_rule, coord, rule_id,
                                       quota_edit.changes_from_body(body), who.name)
        return JSONResponse({"rule": rule.as_dict(), "by": who.name})

    def healthz(request: Request) -> Response:
        dash.ensure_started()
        try:
            redis_ok = all(svc.health().values())
        except BACKEND_ERRORS:
            redis_ok = False
        body = {"redis": redis_ok, "listener": dash.live.alive or not dash.background,
                "indexers": {t: i.leading for t, i in dash.indexers.items()}}
        ok = redis_ok and body["listener"]
        return JSONResponse({"ok": ok, **body}, status_code=200 if ok else 503)

    registry = registry_for(svc, dash.stats)

    def metrics(request: Request) -> Response:
        dash.principal(request)
        return Response(render(registry), media_type=CONTENT_TYPE)

    async def live(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        roots = [r for r in request.query_params.get("roots", "").split(",") if r]
        listener = Listener(tenant, frozenset(roots[:MAX_WATCHED]),
                            asyncio.get_running_loop(),
                            overview=request.query_params.get("view") == "overview")
        dash.live.add(listener)

        def status() -> str:
            return f"data: {json.dumps({'type': 'status', 'redis': dash.live.alive})}\n\n"

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n\n"
                yield status()
                while True:
                    try:
                        msg = await asyncio.wait_for(listener.queue.get(), STATUS_EVERY_S)
                    except asyncio.TimeoutError:
                        # whether Redis answers the live feed: a page says it is
                        # disconnected within seconds of Redis going away
                        yield status()
                        continue
                    if msg is None:
                        return
                    yield f"data: {json.dumps(msg)}\n\n"
            finally:
                dash.live.remove(listener)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    return [Route("/api/trees", trees), Route("/api/trees/{id}", tree),
            Route("/api/trees/{id}/abort", abort, methods=["POST"]),
            Route("/api/trees/{id}/limits", limits, methods=["PUT"]),
            Route("/api/spend", spend), Route("/api/spend.csv", spend_csv),
            Route("/api/shield", shield), Route("/api/sessions", sessions),
            Route("/api/live", live), Route("/api/quotas", quotas),
            Route("/api/quotas/{id}", quota, methods=["GET", "PUT", "DELETE"]),
            Route("/healthz", healthz), Route("/metrics", metrics)]
