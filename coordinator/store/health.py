"""The Redis layer's side of backend health: which errors mean Redis stalled, the error a
call gets while the backend is known to be down, the probe that tells it is back, and the
hot-path timeouts applied to a connection."""

from __future__ import annotations

from typing import Any

import redis

from .backend_check import config_problem
from .cluster_routing import relearn, serves_slots
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
        super().__init__("failing fast until Redis answers a probe")


def is_stall(exc: BaseException) -> bool:
    """True for an error that should open the backend breaker (not a configuration
    error such as a refused password: Redis answered)."""
    return (isinstance(exc, STALLED) and not isinstance(exc, BackendDown)
            and config_problem(exc) is None)


def is_timeout(exc: BaseException) -> bool:
    """A reply that did not come in time (Redis may only be slow), as opposed to a
    connection refused, reset or closed (Redis is not there)."""
    return isinstance(exc, (redis.TimeoutError, TimeoutError))


def set_timeouts(conn: Any, timeout_s: float) -> None:
    """Give a connection not yet connected the hot path's timeouts (connect and reply)."""
    conn.socket_timeout = timeout_s
    conn.socket_connect_timeout = timeout_s


def probe(wires: Wires, node: str, timeout_s: float) -> None:
    """The breaker's probe of ``node`` ('' for a single server): on a Cluster, the slot
    map is re-learnt first, and a node that no longer serves slots passes (its calls now
    go to the new primary); else one PING to it. Raises while it does not answer."""
    if wires.is_cluster:
        if not relearn(wires):
            raise ConnectionError("no cluster node answers")
        if node and not serves_slots(wires, node):
            return
    ping(wires, timeout_s, node)


def ping(wires: Wires, timeout_s: float, node: str = "") -> None:
    """One PING on a fresh connection (to the primary, or a cluster's ``node``, else its
    default node) with ``timeout_s`` for connect and reply; raises when Redis does not
    answer in time."""
    conn = wires.connection(node)
    set_timeouts(conn, timeout_s)
    try:
        wires.ready(conn)
        conn.send_command("PING")
        conn.read_response()
    finally:
        conn.disconnect()
