"""One dashboard instance: its service, credentials, templates and background threads
(live feed, indexers, webhooks), and the request checks every route shares (who is
asking, which tenant, CSRF)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ..core.durations import human_age
from ..runtime.coordinator import Coordinator
from ..store.dashboard_index import DashboardIndex
from .alerts import Notifier, Webhook
from .approval_alerts import approval_crossings, dashboard_url
from .auth import Auth, Principal, csrf_ok, csrf_token
from .charts import sparkline
from .indexer import Indexer
from .live import Live
from .model import AlertRule
from .quota_alerts import quota_crossings
from .service import Service, UnknownTenantError, abortable
from .sessions import SessionsView

ANONYMOUS = Principal("anonymous", "viewer", None, "none")


class Forbidden(Exception):
    """403: authenticated, but not allowed (role, tenant or CSRF)."""


class NeedLogin(Exception):
    """401 for the API, a redirect to the login page for a page."""


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _duration(seconds: float | None) -> str:
    """The CLI's format (``42s``, ``3m05s``, ``2h07m``), one for every age and duration."""
    return "-" if seconds is None else human_age(seconds * 1000)


def _num(value: float | None) -> str:
    """A count with thousands separators: ``311,156``."""
    return "-" if value is None else f"{int(value):,}"


def _plural(n: int | None, word: str, many: str | None = None) -> str:
    """``1 call``, ``2 calls`` (``many``: an irregular plural)."""
    n = int(n or 0)
    return f"{n:,} {word}" if n == 1 else f"{n:,} {many or word + 's'}"


def _when(ms: int | None, now_ms: int) -> Markup:
    """A moment as how long ago, the exact time (UTC) on hover."""
    if not ms:
        return Markup("-")
    exact = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" title="{}">{} ago</time>').format(
        exact, exact, human_age(max(0, now_ms - ms)))


def _when_iso(text: str | None, now_ms: int) -> Markup:
    """:func:`_when` of an ISO 8601 time (a session's); a future one says "in"."""
    try:
        ms = int(datetime.fromisoformat(str(text)).timestamp() * 1000)
    except ValueError:
        return Markup("-")
    if ms <= now_ms:
        return _when(ms, now_ms)
    exact = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" title="{}">in {}</time>').format(
        exact, exact, human_age(ms - now_ms))


def _bar(spend: float | None, held: float | None, ceiling: float | None) -> dict[str, float]:
    """Widths (percent of the bar) of spend and held against the ceiling."""
    if not ceiling:
        return {"spend": 0.0, "held": 0.0}
    s = min(100.0, 100 * (spend or 0) / ceiling)
    return {"spend": s, "held": min(100.0 - s, 100 * (held or 0) / ceiling)}


def _spark(row: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    """The overview's sparkline of a tree row (its last hour)."""
    return sparkline(row.get("series") or [], created_ms=int(row.get("created_ms") or now_ms),
                     now_ms=now_ms, spend_micro=round((row.get("spend_usd") or 0) * 1e6))


class Dashboard:
    """State and shared checks of one app."""

    def __init__(self, coordinators: Mapping[str, Coordinator], auth: Auth, templates: Path, *,
                 rules: Sequence[AlertRule], webhooks: Sequence[Webhook], background: bool,
                 live_tick_s: float, sweep_s: float, cache_s: float) -> None:
        self.service = Service(coordinators, cache_s)
        self.sessions = SessionsView(self.service)
        self.auth = auth
        self.background = background
        self.notifier = Notifier(webhooks) if webhooks and background else None
        self.indexers = {t: Indexer(DashboardIndex(c.client, c.keyspace), rules=rules,
                                    notifier=self.notifier, sweep_s=sweep_s,
                                    retention_s=c.retention_s,
                                    quota_alerts=partial(quota_crossings, c, rules),
                                    approval_alerts=partial(approval_crossings, c.client,
                                                            c.keyspace, t, dashboard_url()))
                         for t, c in self.service.coordinators.items()}
        self.live = Live(self.service.views, tick_s=live_tick_s,
                         on_change=lambda t, r: self.indexers[t].mark_dirty(r))
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates),
                                      autoescape=True, undefined=jinja2.StrictUndefined)
        self.env.filters.update(usd=_usd, pct=_pct, duration=_duration, num=_num,
                                plural=_plural, when=_when, when_iso=_when_iso)
        self.env.globals.update(bar=_bar, spark=_spark, abortable=abortable)
        self._started = False
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        if not self.background or self._started:
            return
        with self._lock:
            if self._started:
                return
            self._started = True
            self.live.start()
            for indexer in self.indexers.values():
                indexer.start()

    def stop(self) -> None:
        if not self._started:
            return
        self.live.stop()
        for indexer in self.indexers.values():
            indexer.stop()
        if self.notifier is not None:
            self.notifier.close()

    def stats(self) -> dict[str, float]:
        return {"alerts": sum(i.alerts_emitted for i in self.indexers.values()),
                "webhooks_sent": self.notifier.sent if self.notifier else 0,
                "webhooks_failed": self.notifier.failed if self.notifier else 0,
                "streams": self.live.listeners}

    # -- who and which tenant ------------------------------------------------------------

    def principal(self, request: Request) -> Principal:
        """The caller; raises NeedLogin when credentials are configured and none given."""
        self.ensure_started()
        found = self.auth.bearer(request.headers.get("authorization"))
        if found is None and "session" in request.scope:
            found = self.auth.session_user(request.session)
        if found is not None:
            return found
        if self.auth.configured:
            raise NeedLogin()
        return ANONYMOUS

    def tenant(self, request: Request, who: Principal) -> str:
        """The tenant asked for (``?tenant=``), default the caller's or the first
        served; 403 when the caller is bound to another one."""
        asked = request.query_params.get("tenant")
        if asked is None:
            asked = who.tenant if who.tenant is not None else self.service.tenants[0]
        if asked not in self.service.views:
            raise UnknownTenantError(f"tenant {asked!r}")
        if not who.may_see(asked):
            raise Forbidden(f"{who.name} may not see tenant {asked!r}")
        return asked

    def check_action(self, request: Request, who: Principal, given_csrf: str | None) -> None:
        """An action needs an operator, and from a browser session a valid CSRF token
        and (when the browser sends one) a same-origin Origin."""
        if not self.auth.configured:
            raise Forbidden("actions need an authenticated operator; no credentials are "
                            "configured (BUDGET_DASHBOARD_USERS or BUDGET_DASHBOARD_TOKENS)")
        if not who.operator:
            raise Forbidden(f"{who.name} is a {who.role}; this action needs an operator")
        if who.via == "bearer":
            return
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            raise Forbidden("cross-origin request refused")
        if not csrf_ok(request.session, given_csrf):
            raise Forbidden("missing or wrong CSRF token; reload the page and retry")

    # -- rendering -----------------------------------------------------------------------

    def base(self, request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def render(self, request: Request, template: str, status: int = 200,
               headers: Mapping[str, str] | None = None, **context: Any) -> HTMLResponse:
        who = context.pop("who", None)
        session = request.session if "session" in request.scope else {}
        html = self.env.get_template(template).render(
            base=self.base(request), who=who, auth_configured=self.auth.configured,
            csrf=csrf_token(session) if "session" in request.scope else "",
            tenants=[t for t in self.service.tenants if who is None or who.may_see(t)],
            **context)
        return HTMLResponse(html, status_code=status, headers=dict(headers or {}))

    def is_api(self, request: Request) -> bool:
        path = request.url.path
        return "/api/" in path or path.endswith(("/healthz", "/metrics"))

    def error(self, request: Request, status: int, message: str,
              headers: Mapping[str, str] | None = None) -> Response:
        if self.is_api(request):
            return JSONResponse({"error": message, "status": status}, status_code=status,
                                headers=dict(headers or {}))
        try:  # a logged-in user's error page says so (and offers no "log in")
            who: Principal | None = self.principal(request)
        except NeedLogin:
            who = None
        return self.render(request, "error.html", status, headers, code=status,
                           message=message, retry=status == 503, who=who)

    def need_login(self, request: Request) -> Response:
        if self.is_api(request):
            return JSONResponse({"error": "authentication required", "status": 401},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        base, path = self.base(request), request.url.path
        if base and path.startswith(base):
            path = path[len(base):]  # the app's own path: login adds the mount again
        target = path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{base}/login?next={quote(target)}", 303)
