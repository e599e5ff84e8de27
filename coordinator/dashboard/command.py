"""``budgetctl dashboard``: serve the dashboard with uvicorn; ``budgetctl alerts``: only
the indexer and its alerts, without the web part (coordinator/cli/dashboard.py calls
``serve`` and ``run_alerts``; ``python -m coordinator.dashboard`` parses the same flags).

    python -m coordinator.dashboard [--redis URL] [--host 127.0.0.1] [--port 8700]
    python -m coordinator.dashboard alerts [--redis URL]
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sys
import threading
from collections.abc import Sequence
from functools import partial

from ..errors import InvalidConfigError
from ..runtime.coordinator import Coordinator
from ..runtime.settings import default_url
from ..store.dashboard_index import DashboardIndex
from ..store.dashboard_reads import DashboardReads
from .alerts import Notifier, rules_from_env, webhooks_from_env
from .app import create_app
from .approval_alerts import approval_crossings, dashboard_url
from .auth import Auth
from .indexer import Indexer
from .live import Live
from .model import ROW_FIELDS

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700


class UnsafeBindError(RuntimeError):
    """Serving beyond loopback without credentials."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sweep_from_env() -> float:
    """``BUDGET_DASHBOARD_SWEEP_S`` (5 by default): seconds from 0.1 to 3600 between the
    indexer's sweeps; InvalidConfigError otherwise."""
    text = os.environ.get("BUDGET_DASHBOARD_SWEEP_S") or "5"
    try:
        sweep = float(text)
    except ValueError:
        sweep = math.nan
    if not 0.1 <= sweep <= 3600:  # (NaN fails it)
        raise InvalidConfigError("dashboard setting", [{
            "loc": ("BUDGET_DASHBOARD_SWEEP_S",), "input": text,
            "msg": "must be a number of seconds from 0.1 to 3600"}])
    return sweep


def _port(text: str) -> int:
    """A ``--port``: an integer from 1 to 65535."""
    port = int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a port from 1 to 65535")
    return port


def _tenants(tenants: Sequence[str] | None) -> list[str]:
    if tenants is not None:
        return list(tenants)
    listed = os.environ.get("BUDGET_DASHBOARD_TENANTS")
    return [t.strip() for t in listed.split(",")] if listed else [
        os.environ.get("BUDGET_TENANT", "")]


def run_alerts(redis_url: str | None = None, *, tenants: Sequence[str] | None = None,
               stop: threading.Event | None = None) -> None:
    """Keep the indexes and evaluate alerts (``BUDGET_ALERT_*``) without serving pages,
    until ``stop`` is set (or the process is interrupted). Any number of such processes
    and dashboards may run: one holds the indexer's lease, and alerts are deduplicated
    in Redis."""
    url = redis_url or default_url()
    coords = {t: Coordinator.from_url(url, tenant=t) for t in _tenants(tenants)}
    views = {t: DashboardReads(c.client, c.keyspace, ROW_FIELDS) for t, c in coords.items()}
    hooks = webhooks_from_env()
    notifier = Notifier(hooks) if hooks else None
    sweep_s = sweep_from_env()
    base = dashboard_url()
    indexers = {t: Indexer(DashboardIndex(c.client, c.keyspace), rules=rules_from_env(),
                           notifier=notifier, sweep_s=sweep_s, retention_s=c.retention_s,
                           approval_alerts=partial(approval_crossings, c.client, c.keyspace,
                                                   t, base))
                for t, c in coords.items()}
    live = Live(views, on_change=lambda t, r: indexers[t].mark_dirty(r))
    live.start()
    for indexer in indexers.values():
        indexer.start()
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
        for indexer in indexers.values():
            indexer.stop()
        if notifier is not None:
            notifier.close()
        for c in coords.values():
            c.close()


def serve(redis_url: str | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          *, tenants: Sequence[str] | None = None, auth: Auth | None = None,
          log_level: str = "info") -> None:
    """Serve the dashboard until interrupted. Credentials, tenants, alerts and webhooks
    come from the environment unless given (``BUDGET_DASHBOARD_USERS``,
    ``BUDGET_DASHBOARD_TOKENS``, ``BUDGET_DASHBOARD_SECRET``, ``BUDGET_DASHBOARD_TENANTS``,
    ``BUDGET_ALERT_*``, ``BUDGET_DASHBOARD_SWEEP_S``: seconds between the indexer's
    full passes, default 5). Raises UnsafeBindError, before binding, for a non-loopback
    ``host`` without credentials."""
    import uvicorn

    auth = auth if auth is not None else Auth.from_env()
    if not is_loopback(host) and not auth.configured:
        raise UnsafeBindError(
            f"refusing to serve on {host}: without credentials anyone who reaches it sees "
            "every budget. Set BUDGET_DASHBOARD_USERS (name:role:password) or "
            "BUDGET_DASHBOARD_TOKENS (role:token), or bind 127.0.0.1.")
    url = redis_url or default_url()
    coords = {t: Coordinator.from_url(url, tenant=t) for t in _tenants(tenants)}
    app = create_app(coords, auth, alert_rules=rules_from_env(), webhooks=webhooks_from_env(),
                     sweep_s=sweep_from_env())
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coordinator.dashboard [alerts] [--redis URL] [--host H] [--port P]``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["alerts"]:
        alerts = argparse.ArgumentParser(prog="budgetctl alerts",
                                         description="keep the indexes and send alerts")
        alerts.add_argument("--redis", default=None)
        run_alerts(alerts.parse_args(args_list[1:]).redis)
        return 0
    argv = args_list
    parser = argparse.ArgumentParser(prog="budgetctl dashboard",
                                     description="serve the budget dashboard")
    parser.add_argument("--redis", default=None, help="Redis URL (default: BUDGET_REDIS_URL, "
                        "REDIS_URL, redis://localhost:6379/0)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    try:
        serve(args.redis, args.host, args.port)
    except (UnsafeBindError, ValueError) as exc:
        print(f"budgetctl dashboard: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
