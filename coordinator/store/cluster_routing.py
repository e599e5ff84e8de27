"""Where a Cluster's calls go after a fault: the slot map re-learnt when a node stops
answering (as redis-py's ``RedisCluster`` does on a connection error or timeout), whether
a node still serves slots, and the replies that mean a route is stale (a demoted primary
that refuses writes or ``WAIT``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import redis

from .errors import tag_node
from .topology import Durability, NotReplicatedError, Wires


class Keyed(Protocol):
    """An op of the wire, as far as routing goes: the key that places it."""

    @property
    def key(self) -> str | None: ...


K = TypeVar("K", bound=Keyed)

log = logging.getLogger("coordinator")

_STALE_ROUTE_REPLIES = ("WAIT cannot be used with replica instances", "READONLY")


def is_stale_route(exc: BaseException) -> bool:
    """A reply from a node that is no longer the primary of the key (a failover demoted
    it): re-learn the topology and send again."""
    return isinstance(exc, (redis.ReadOnlyError, NotReplicatedError, redis.ResponseError)
                      ) and any(s in str(exc) for s in _STALE_ROUTE_REPLIES)


def relearn(wires: Wires) -> bool:
    """Re-learn a cluster's slot map from any node that answers (False when none does,
    or on one server, where a reconnect finds the primary by itself)."""
    if not wires.is_cluster:
        return False
    try:
        wires.refresh()
    except (redis.RedisError, OSError) as exc:
        log.debug("could not re-learn the cluster's slots: %s", exc)
        return False
    return True


def serves_slots(wires: Wires, node: str) -> bool:
    """Whether ``node`` is a primary in the slot map as last learnt."""
    cluster: Any = wires.cluster
    if cluster is None:
        return True
    return any(n.name == node for n in cluster.get_primaries())


def not_replicated(wait_reply: Any, durability: Durability, node: str) -> NotReplicatedError:
    """The error of a ``WAIT`` on ``node`` that too few replicas acknowledged (its reply
    is a count, or the error of a node demoted to a replica)."""
    exc = NotReplicatedError(f"WAIT: {wait_reply} of {durability.replicas} replicas "
                             f"within {durability.timeout_ms} ms")
    tag_node(exc, node)
    return exc


def queued_for_nodes(wires: Wires, queued: list[K], along: Sequence[K]
                     ) -> tuple[list[K], list[K]]:
    """(the queued writes to send with ``along``, those to leave queued): on a Cluster,
    a call's round trip carries only the writes for the nodes it goes to, so a dead
    primary's queued writes never fail the calls of the others (the flusher, sending
    ``along`` nothing, carries them all); elsewhere, all of them."""
    if wires.cluster is None or not along or not queued:
        return queued, []
    nodes = {wires.node_of(op.key) for op in along}
    now: list[K] = []
    later: list[K] = []
    for op in queued:
        (now if wires.node_of(op.key) in nodes else later).append(op)
    return now, later
