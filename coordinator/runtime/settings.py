"""Settings: the defaults of a Coordinator and where its Redis URL comes from."""

from __future__ import annotations

import os

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_LEASE_MS = 60_000
DEFAULT_RETENTION_S = 7 * 24 * 3600
FLUSH_AFTER_S = 0.02


def default_url() -> str:
    """``BUDGET_REDIS_URL``, then ``REDIS_URL``, then ``redis://localhost:6379/0``."""
    return os.environ.get("BUDGET_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL
