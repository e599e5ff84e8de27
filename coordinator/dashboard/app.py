"""The dashboard's ASGI app (Starlette): pages, JSON API, live stream, login and
actions, with security headers and a signed session cookie."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    ContextClosedError,
    ContextNotFoundError,
    CorruptStateError,
    QuotaNotFoundError,
)
from ..runtime.coordinator import Coordinator
from ..store.dashboard_reads import BACKEND_ERRORS
from .alerts import Webhook
from .api import api_routes
from .auth import Auth
from .model import AlertRule
from .pages import page_routes
from .runtime import Dashboard, Forbidden, NeedLogin
from .service import NotRunningError, UnknownTenantError

HERE = Path(__file__).parent
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")


class _SecurityHeaders:
    """No inline script runs (CSP), no framing, no sniffing, no referrer leaks."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"content-security-policy", CSP.encode()),
                                      (b"x-frame-options", b"DENY"),
                                      (b"x-content-type-options", b"nosniff"),
                                      (b"referrer-policy", b"same-origin")]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(
    coordinator: Coordinator | Mapping[str, Coordinator],
    auth: Auth | None = None,
    *,
    alert_rules: Sequence[AlertRule] | None = None,
    webhooks: Sequence[Webhook] = (),
    background: bool = True,
    live_tick_s: float = 0.5,
    sweep_s: float = 5.0,
    cache_s: float = 0.25,
) -> Starlette:
    """The dashboard as an ASGI app, to serve (``command.serve``) or to mount into
    another app: ``Mount("/budget", app=create_app(coord, auth=Auth.from_env()))``.

    ``coordinator``: one coordinator, or one per tenant served ({tenant: coordinator}).
    ``auth``: credentials (default none: pages open, every action refused).
    ``alert_rules``: thresholds (default 50 %, 80 %, 100 % of every root's ceiling);
    ``webhooks``: where alerts are POSTed. ``background``: run the live feed and the
    indexer (which evaluates alerts) in this process, from the app's start, or from its
    first request when mounted (a parent app does not run a mounted app's lifespan)."""
    coords = dict(coordinator) if isinstance(coordinator, Mapping) else {
        coordinator.tenant: coordinator}
    dash = Dashboard(coords, auth or Auth(), HERE / "templates",
                     rules=list(alert_rules) if alert_rules is not None else [AlertRule()],
                     webhooks=list(webhooks), background=background,
                     live_tick_s=live_tick_s, sweep_s=sweep_s, cache_s=cache_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dash.ensure_started()
        try:
            yield
        finally:
            await asyncio.to_thread(dash.stop)

    def handler(status: int, message: str | None = None,
                headers: Mapping[str, str] | None = None) -> Any:
        async def handle(request: Request, exc: Exception) -> Response:
            return dash.error(request, status, message or str(exc), headers)
        return handle

    async def need_login(request: Request, exc: Exception) -> Response:
        return dash.need_login(request)

    handlers: dict[Any, Any] = {
        ContextNotFoundError: handler(404), UnknownTenantError: handler(404),
        QuotaNotFoundError: handler(404),
        ValueError: handler(400), Forbidden: handler(403), NeedLogin: need_login,
        NotRunningError: handler(409), ContextClosedError: handler(409),
        CorruptStateError: handler(409),
        **{cls: handler(503, "Redis is unavailable; this page retries in 5 s",
                        {"Retry-After": "5"}) for cls in BACKEND_ERRORS},
    }
    app = Starlette(
        routes=[*page_routes(dash), *api_routes(dash),
                Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static")],
        exception_handlers=handlers, lifespan=lifespan,
        middleware=[Middleware(_SecurityHeaders),
                    Middleware(SessionMiddleware, secret_key=dash.auth.secret_key,
                               session_cookie="budget_dashboard", same_site="strict",
                               https_only=dash.auth.secure_cookie,
                               max_age=12 * 3600)])
    app.state.dashboard = dash
    return app
