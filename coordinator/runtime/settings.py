"""Settings: the defaults of a Coordinator and where its Redis URL comes from."""

from __future__ import annotations

import os

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_LEASE_MS = 60_000
DEFAULT_RETENTION_S = 7 * 24 * 3600
FLUSH_AFTER_S = 0.02

DEFAULT_HOT_TIMEOUT_MS = 250
"""Connect and reply timeout of the hot path's round trips (reserve, settle, the scripts
of a call, close): sized for a budget check, so a stalled Redis costs a call at most this
before it fails closed (``BUDGET_HOT_TIMEOUT_MS``)."""
DEFAULT_LONG_TIMEOUT_MS = 5_000
"""Reply timeout of the long operations on the client's pool: snapshots and reads, views,
lease renewal, pub/sub, gc (``BUDGET_LONG_TIMEOUT_MS``)."""
DEFAULT_PROBE_INTERVAL_MS = 500
"""While Redis is stalled, calls fail fast and one probe pings it this often; calls flow
again within one interval of its answer (``BUDGET_PROBE_INTERVAL_MS``)."""


def default_url() -> str:
    """``BUDGET_REDIS_URL``, then ``REDIS_URL``, then ``redis://localhost:6379/0``."""
    return os.environ.get("BUDGET_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL
