"""A reserve's one second chance: a round trip that got no answer (a connection a
failover made stale, a cluster node gone, one slow reply) is sent once more, on a fresh
connection to the node the topology names now, before the call is refused. Safe because
a reserve is idempotent by its id (the same id already held holds nothing more)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .cluster_routing import is_stale_route, relearn
from .health import STALLED, BackendDown, is_timeout
from .topology import NotReplicatedError
from .wire import Op, Wire

log = logging.getLogger("coordinator")


def round_trip_resending(wire: Wire, ops: Sequence[Op], *, resend: bool,
                         after_timeout: bool = True) -> list[Any]:
    """``wire.round_trip(ops)``; with ``resend``, once more when the first got no answer
    (``after_timeout``: a timeout too, not only a lost connection) or a reply of a
    demoted primary (after re-learning a cluster's slot map). The second attempt's error
    is raised as it is."""
    try:
        replies = wire.round_trip(ops)
    except STALLED as exc:
        if (not resend or isinstance(exc, BackendDown) or not _worth_resending(exc)
                or (is_timeout(exc) and not after_timeout)):
            raise
        log.info("no answer from Redis (%s): sending once more", exc)
        relearn(wire.topology)
        return wire.round_trip(ops)
    if resend and any(isinstance(r, Exception) and is_stale_route(r) for r in replies):
        relearn(wire.topology)
        return wire.round_trip(ops)
    return replies


def _worth_resending(exc: BaseException) -> bool:
    """Not a WAIT that too few replicas acknowledged (sending again would only wait
    again), unless the node it went to was demoted."""
    return not isinstance(exc, NotReplicatedError) or is_stale_route(exc)


def run_resending(wire: Wire, op: Op, *, resend: bool) -> Any:
    """The reply of one op (see :func:`round_trip_resending`); a script error is raised."""
    reply = round_trip_resending(wire, [op], resend=resend)[0]
    if isinstance(reply, Exception):
        raise reply
    return reply
