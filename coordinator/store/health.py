"""The Redis layer's side of backend health: which errors mean Redis stalled, the error a
call gets while the backend is known to be down, the probe that tells it is back, and the
hot-path timeouts applied to a connection."""

from __future__ import annotations

from typing import Any

import redis

from .topology import Wires

STALLED: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, OSError)
"""Errors meaning Redis did not answer (unreachable, or no reply within the timeout): they
open the backend breaker. A full Redis (OOM) answers, so it is not one of them."""


class BackendDown(ConnectionError):
    """Redis is known to be down (the backend breaker is open): nothing was sent.

    A ``ConnectionError`` (so an ``OSError``), it is one of ``store.errors.UNAVAILABLE``:
    every caller treats it as an unreachable Redis, without waiting a socket timeout."""

    def __init__(self) -> None:
        super().__init__("Redis backend unavailable (failing fast until a probe succeeds)")


def is_stall(exc: BaseException) -> bool:
    """True for an error that should open the backend breaker."""
    return isinstance(exc, STALLED) and not isinstance(exc, BackendDown)


def set_timeouts(conn: Any, timeout_s: float) -> None:
    """Give a connection not yet connected the hot path's timeouts (connect and reply)."""
    conn.socket_timeout = timeout_s
    conn.socket_connect_timeout = timeout_s


def ping(wires: Wires, timeout_s: float) -> None:
    """One PING on a fresh connection (to the primary, or a cluster's default node) with
    ``timeout_s`` for connect and reply; raises when Redis does not answer in time."""
    conn = wires.connection("")
    set_timeouts(conn, timeout_s)
    try:
        wires.ready(conn)
        conn.send_command("PING")
        conn.read_response()
    finally:
        conn.disconnect()
