"""A ``requests`` transport adapter that sends the current context to the hosts you
name: ``mount_budget_context(session, hosts=["billing.internal"])``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from .common import HostPolicy


class BudgetContextAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that sets the ``budget-context`` header from
    ``current_context()`` on requests to ``hosts`` and strips it from any other request
    it sends (redirects go through the adapter again)."""

    def __init__(self, *, hosts: Iterable[str], **kwargs: Any) -> None:
        self._policy = HostPolicy(hosts)
        super().__init__(**kwargs)

    def add_headers(self, request: requests.PreparedRequest, **kwargs: Any) -> None:
        url = urlsplit(request.url or "")
        self._policy.apply(url.scheme, url.hostname or "", url.port, request.headers)


def mount_budget_context(session: requests.Session, *, hosts: Iterable[str]
                         ) -> requests.Session:
    """Route every http(s) request of ``session`` through a :class:`BudgetContextAdapter`
    (replacing the default adapters) and return the session."""
    adapter = BudgetContextAdapter(hosts=hosts)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
