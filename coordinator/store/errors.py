"""The Redis layer's error types, for the layers above to catch without importing redis."""

from __future__ import annotations

import redis

RedisError = redis.RedisError
"""Any error of the Redis client (connection, timeout, script, reply)."""

UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError, OSError)
"""Errors meaning Redis cannot serve the budget now: unreachable, timed out, or full (a
``noeviction`` Redis past ``maxmemory`` refuses a script's first write, so nothing of it
is written). Calls fail closed on them; what is queued stays queued."""
