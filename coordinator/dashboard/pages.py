"""The HTML pages (Jinja2, autoescaped): overview, tree, spend, shield, sessions, quotas,
login; the tree page's abort and limits forms and the Quotas page's rule forms. Each page
renders the same service data as its API twin."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..core.labels import LABELS
from ..quotas import Quotas
from . import limits_edit, quota_edit
from .api import clean_reason, page_query, since_of, trees_query
from .auth import LoginThrottle, csrf_ok, csrf_token
from .charts import day_bars
from .model import SORTS
from .quota_page import quota_page
from .runtime import Dashboard, Forbidden

SPEND_BY = ("org", "team", "service")


def _safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no //host) is followed after login."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def page_routes(dash: Dashboard) -> list[Route]:
    svc = dash.service
    throttle = LoginThrottle()

    def overview(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        query = trees_query(request)
        data = svc.trees(tenant, **query)
        fragment = request.query_params.get("fragment") == "1"
        pages = max(1, -(-data["total"] // data["size"]))

        def link(**change: object) -> str:
            params = {"tenant": tenant, "sort": query["sort"], "label": query["label"] or "",
                      "state": query["state"] or "", "page": query["page"],
                      "size": query["size"] if query["size"] != 50 else "", **change}
            return "?" + urlencode({k: v for k, v in params.items() if v not in ("", None)})

        return dash.render(request, "_rows.html" if fragment else "overview.html", who=who,
                           tenant=tenant, data=data, sorts=SORTS, labels=LABELS, pages=pages,
                           link=link, query=query)

    def tree(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        data = svc.tree(tenant, request.path_params["id"], since_of(request))
        fragment = request.query_params.get("fragment") == "1"
        return dash.render(request, "_tree.html" if fragment else "tree.html", who=who,
                           tenant=tenant, data=data, message=request.query_params.get("msg"))

    async def abort(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        form = await request.form()
        csrf = form.get("csrf")
        dash.check_action(request, who, csrf if isinstance(csrf, str) else None)
        reason = clean_reason(form.get("reason"))
        ctx_id = request.path_params["id"]
        await run_in_threadpool(svc.abort, tenant, ctx_id, reason, who.name, who.role)
        query = urlencode({"tenant": tenant, "msg": f"aborted by {who.name}: {reason}"})
        return RedirectResponse(f"{dash.base(request)}/trees/{ctx_id}?{query}", 303)

    async def limits(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        form = await request.form()
        csrf = form.get("csrf")
        dash.check_action(request, who, csrf if isinstance(csrf, str) else None)
        fields = {k: v.strip() for k, v in form.items() if isinstance(v, str)}
        changes = limits_edit.limits_from(fields, also=("reason", "csrf"))
        reason = clean_reason(form.get("reason"))
        ctx_id = request.path_params["id"]
        done = await run_in_threadpool(limits_edit.change_limits, svc, tenant, ctx_id, changes,
                                       reason, who.name)
        query = urlencode({"tenant": tenant, "msg": limits_edit.change_text(done)})
        return RedirectResponse(f"{dash.base(request)}/trees/{ctx_id}?{query}", 303)

    def spend(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        data = svc.spend(tenant, request.query_params.get("day"),
                         request.query_params.get("by") or "team")
        chart = day_bars([d["day"] for d in data["days"]],
                         {d["day"]: {v: round(u * 1e6) for v, u in d["by"].items()}
                          for d in data["days"]},
                         {d["day"]: round(d["total"] * 1e6) for d in data["days"]},
                         data["by"])
        peak = max([r["closed"] + r["open"] for r in data["rows"] if r["unit"] == "usd"] or [0])
        peak_tokens = max([r["closed"] + r["open"] for r in data["rows"]
                           if r["unit"] == "tokens"] or [0])
        return dash.render(request, "spend.html", who=who, tenant=tenant, data=data,
                           peak=peak or 1, peak_tokens=peak_tokens or 1, chart=chart,
                           labels=SPEND_BY)

    def shield(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        return dash.render(request, "shield.html", who=who, tenant=tenant,
                           data=svc.shield(tenant))

    def quotas(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        quotas = Quotas(svc.coordinators[tenant])
        rules = quotas.rules()
        return dash.render(request, "quotas.html", who=who, tenant=tenant,
                           data=quota_page(quotas, rules), rules=rules,
                           message=request.query_params.get("msg"))

    async def quota_action(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        coord = svc.coordinators[tenant]
        form = await request.form()
        csrf = form.get("csrf")
        dash.check_action(request, who, csrf if isinstance(csrf, str) else None)
        if request.path_params.get("id"):
            rule_id = request.path_params["id"]
            await run_in_threadpool(quota_edit.delete_rule, coord, rule_id, who.name)
            message = f"quota {rule_id} deleted by {who.name}"
        else:
            rule_id, changes = quota_edit.changes_from_form(form)
            rule = await run_in_threadpool(quota_edit.change_rule, coord, rule_id, changes,
                                           who.name)
            message = f"quota {rule.id} set by {who.name} (version {rule.version})"
        query = urlencode({"tenant": tenant, "msg": message})
        return RedirectResponse(f"{dash.base(request)}/quotas?{query}", 303)

    def sessions(request: Request) -> Response:
        who = dash.principal(request)
        tenant = dash.tenant(request, who)
        data = dash.sessions.page(tenant, **page_query(request))
        pages = max(1, -(-data["total"] // data["size"]))

        def link(page: int) -> str:
            params = {"tenant": tenant, "page": page,
                      "size": data["size"] if data["size"] != 50 else ""}
            return "?" + urlencode({k: v for k, v in params.items() if v != ""})

        return dash.render(request, "sessions.html", who=who, tenant=tenant, data=data,
                           pages=pages, link=link)

    async def login(request: Request) -> Response:
        target = _safe_next(request.query_params.get("next"))
        if request.method == "GET":
            return dash.render(request, "login.html", target=target, failed=False,
                               locked=False)
        form = await request.form()
        csrf = form.get("csrf")
        if not csrf_ok(request.session, csrf if isinstance(csrf, str) else None):
            raise Forbidden("missing or wrong CSRF token; reload the login page")
        name, password = form.get("user"), form.get("password")
        if not isinstance(name, str) or not isinstance(password, str):
            raise ValueError("user and password are required")
        now = time.monotonic()
        if throttle.locked(name, now):
            return dash.render(request, "login.html", 429, {"Retry-After": "60"},
                               target=target, failed=False, locked=True)
        who = await run_in_threadpool(dash.auth.login, name, password)  # PBKDF2: not here
        if who is None:
            throttle.failed(name, now)
            return dash.render(request, "login.html", 401, target=target, failed=True,
                               locked=False)
        throttle.succeeded(name)
        request.session.clear()
        request.session["user"] = who.name
        csrf_token(request.session)
        return RedirectResponse(dash.base(request) + target, 303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        csrf = form.get("csrf")
        if not csrf_ok(request.session, csrf if isinstance(csrf, str) else None):
            raise Forbidden("missing or wrong CSRF token")
        request.session.clear()
        return RedirectResponse(f"{dash.base(request)}/login", 303)

    return [Route("/", overview), Route("/trees/{id}", tree),
            Route("/trees/{id}/abort", abort, methods=["POST"]),
            Route("/trees/{id}/limits", limits, methods=["POST"]),
            Route("/spend", spend), Route("/shield", shield), Route("/sessions", sessions),
            Route("/quotas", quotas), Route("/quotas/set", quota_action, methods=["POST"]),
            Route("/quotas/{id}/delete", quota_action, methods=["POST"]),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"])]
