"""httpx event hooks that send the current context to the hosts you name.

``httpx.Client(event_hooks=budget_event_hooks(hosts=["billing.internal"]))`` or, for
``httpx.AsyncClient``, :func:`async_budget_event_hooks`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .common import HostPolicy


def budget_event_hooks(*, hosts: Iterable[str]) -> dict[str, list[Callable[[Any], None]]]:
    """Event hooks for ``httpx.Client``: each request to one of ``hosts`` (``host``,
    ``host:port`` or ``*``) carries the ``budget-context`` header of
    ``current_context()``; requests to any other host (a redirect included) carry none."""
    policy = HostPolicy(hosts)

    def add_context(request: Any) -> None:
        policy.apply(request.url.scheme, request.url.host, request.url.port,
                     request.headers)

    return {"request": [add_context]}


def async_budget_event_hooks(
    *, hosts: Iterable[str]
) -> dict[str, list[Callable[[Any], Awaitable[None]]]]:
    """The same hooks for ``httpx.AsyncClient``."""
    policy = HostPolicy(hosts)

    async def add_context(request: Any) -> None:
        policy.apply(request.url.scheme, request.url.host, request.url.port,
                     request.headers)

    return {"request": [add_context]}
