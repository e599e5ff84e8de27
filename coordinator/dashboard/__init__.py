"""The ops dashboard: a live web view of every budget tree, served from the Redis state
the library keeps, with a JSON API, alerts, an authenticated abort and metrics. Needs
the ``dashboard`` extra (``pip install budget-coordinator[dashboard]``)."""

from __future__ import annotations

from .alerts import Webhook
from .app import create_app
from .auth import Auth, hash_password
from .command import serve
from .model import AlertRule

__all__ = ["AlertRule", "Auth", "Webhook", "create_app", "hash_password", "serve"]
