"""``budgetctl dashboard``: serve the dashboard with uvicorn (the CLI wires this in).

    python -m coordinator.dashboard [--redis URL] [--host 127.0.0.1] [--port 8700]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Sequence

from ..coordinator import Coordinator, default_url
from .alerts import rules_from_env, webhooks_from_env
from .app import create_app
from .auth import Auth

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
    if tenants is None:
        listed = os.environ.get("BUDGET_DASHBOARD_TENANTS")
        tenants = [t.strip() for t in listed.split(",")] if listed else [
            os.environ.get("BUDGET_TENANT", "")]
    coords = {t: Coordinator.from_url(url, tenant=t) for t in tenants}
    app = create_app(coords, auth, alert_rules=rules_from_env(), webhooks=webhooks_from_env(),
                     sweep_s=float(os.environ.get("BUDGET_DASHBOARD_SWEEP_S") or 5.0))
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="budgetctl dashboard",
                                     description="serve the budget dashboard")
    parser.add_argument("--redis", default=None, help="Redis URL (default: BUDGET_REDIS_URL, "
                        "REDIS_URL, redis://localhost:6379/0)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    try:
        serve(args.redis, args.host, args.port)
    except (UnsafeBindError, ValueError) as exc:
        print(f"budgetctl dashboard: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
