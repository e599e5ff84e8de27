"""Settings: the defaults of a Coordinator and where its Redis URL comes from."""

from __future__ import annotations

import os

from ..errors import TopologySettingError
from ..models_base import decimal_text

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

SETTING_RANGES = {"lease_ms": (1, 86_400_000), "retention_s": (1, 36500 * 86400),
                  "hot_timeout_ms": (1, 3_600_000), "long_timeout_ms": (1, 3_600_000),
                  "probe_interval_ms": (1, 3_600_000), "replicas": (1, 16)}
"""A coordinator's numeric settings and their ranges (a day's lease, a century's
retention, an hour's timeouts; replicas as ``Durability`` takes them): past them, no
timer, timeout or expiry can work."""


def checked_setting(name: str, value: object, env: str = "") -> int:
    """``value`` of setting ``name`` as an integer in its range (a string, as the
    environment variable ``env`` gives it, must be decimal digits). Raises
    TopologySettingError naming ``env`` or ``name``."""
    low, high = SETTING_RANGES[name]
    value = decimal_text(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TopologySettingError(env or name, value, f"an integer from {low} to {high}")
    return value


def default_url() -> str:
    """``BUDGET_REDIS_URL``, then ``REDIS_URL``, then ``redis://localhost:6379/0``."""
    return os.environ.get("BUDGET_REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL
