"""Scripted replies for a call's steps (the h11 way: the logic is fed its input, no I/O):
a :class:`Script` answers each request the steps yield with the next reply it was given,
and checks the request is of the kind expected. The coordinator and the context state
are the real ones, on a Redis client that connects to nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from coordinator import ChainMetadata, Coordinator, ExecutionConfig
from coordinator.context.state import ContextState
from coordinator.context.steps import Request
from coordinator.core.paths import Path


class NoRedis(redis.Connection):
    """A connection that never connects: every attempt fails like an unreachable Redis."""

    attempts = 0

    def connect(self) -> None:
        NoRedis.attempts += 1
        raise redis.ConnectionError("unit tests have no Redis")


def offline_coordinator(**kwargs: Any) -> Coordinator:
    """A real coordinator whose client can reach no Redis."""
    pool = redis.ConnectionPool(connection_class=NoRedis)
    return Coordinator(redis.Redis(connection_pool=pool), **kwargs)


def context_state(coord: Coordinator, ids: tuple[str, ...] = ("root",), **config: Any
                  ) -> ContextState:
    """A context already open (as if its open had landed), at ``ids`` in its tree."""
    limits: dict[str, Any] = {"max_cost_usd": 10.0, "max_steps": 100, "max_retries_total": 3}
    limits.update(config)
    return ContextState(coord, Path(ids[0], ids), ExecutionConfig(**limits),
                        ChainMetadata(), None, None, owner=True)


Reply = Any
"""A value, an exception to raise, or a function of the request giving either."""


@dataclass
class Script:
    """Answers requests in order: each expected as ``(request type, reply)``."""

    expected: list[tuple[type, Reply]]
    asked: list[Request] = field(default_factory=list)

    def __call__(self, request: Request) -> Any:
        self.asked.append(request)
        assert self.expected, f"no reply scripted for {request!r}"
        kind, reply = self.expected.pop(0)
        assert isinstance(request, kind), f"expected a {kind.__name__}, got {request!r}"
        if callable(reply) and not isinstance(reply, type):
            reply = reply(request)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def done(self) -> bool:
        """Whether every scripted reply was asked for."""
        return not self.expected
