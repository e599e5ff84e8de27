"""``budgetctl dashboard`` and ``budgetctl alerts``: run coordinator.dashboard (web pages
and the indexer; or the indexer and its alerts alone), imported only when the command
runs (it needs the ``dashboard`` extra, which the rest of budgetctl does not)."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from ._common import fail, redis_url
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(cls=PlainGroup)


def _missing(exc: ImportError) -> NoReturn:
    """Exit 2 naming the extra the dashboard needs (starlette, uvicorn, jinja2, ...)."""
    fail(f"the dashboard needs the 'dashboard' extra (pip install "
         f"'budget-coordinator[dashboard]'): {exc}", 2)


@app.command(cls=PlainCommand)
def dashboard(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind; beyond loopback only with credentials "
        "(BUDGET_DASHBOARD_USERS or BUDGET_DASHBOARD_TOKENS).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535,
                                      help="Port to serve on.")] = 8700,
) -> None:
    """Serve the web dashboard (docs/dashboard.md) until interrupted."""
    try:
        from ..dashboard.command import UnsafeBindError, serve
    except ImportError as exc:
        _missing(exc)
    try:
        serve(redis_url(ctx), host, port)
    except (UnsafeBindError, ValueError) as exc:
        fail(f"dashboard: {exc}", 2)


@app.command(cls=PlainCommand)
def alerts(ctx: typer.Context) -> None:
    """Keep the dashboard's indexes and send alerts (BUDGET_ALERT_*), without pages."""
    try:
        from ..dashboard.command import run_alerts
    except ImportError as exc:
        _missing(exc)
    try:
        run_alerts(redis_url(ctx))
    except ValueError as exc:  # a URL that cannot work, a misconfigured Redis
        fail(f"alerts: {exc}", 2)
