"""The Redis layer's error types, for the layers above to catch without importing redis."""

from __future__ import annotations

import redis

RedisError = redis.RedisError
"""Any error of the Redis client (connection, timeout, script, reply)."""

MOVED: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError)
"""A cluster node that does not serve the key's slot now (the slots moved, a failover)."""

UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError, OSError,
    *MOVED)
"""Errors meaning Redis cannot serve the budget now: unreachable, timed out, or full (a
``noeviction`` Redis past ``maxmemory`` refuses a script's first write, so nothing of it
is written), or a cluster node that does not serve the tree's slot now. Calls fail
closed on them; what is queued stays queued."""


_NODE_ATTR = "budget_node"


def tag_node(exc: BaseException, node: str) -> None:
    """Name on ``exc`` the node whose connection raised it (see :func:`failed_node`)."""
    setattr(exc, _NODE_ATTR, node)


def failed_node(exc: BaseException) -> str | None:
    """The node whose connection raised ``exc`` ('' for a single server), if known."""
    node = getattr(exc, _NODE_ATTR, None)
    return node if isinstance(node, str) else None
