"""Context propagation over HTTP: the ``budget-context`` header.

Server side, :class:`BudgetContextMiddleware` (ASGI: Starlette, FastAPI) and
:class:`BudgetContextWSGIMiddleware` attach the caller's context for the request, so that
``current_context()`` in a handler spends inside the caller's tree. Client side,
:mod:`coordinator.http.httpx_client` and :mod:`coordinator.http.requests_client` add the
header from the current context, to the hosts you name only.
"""

from __future__ import annotations

from .common import HEADER
from .wsgi import BudgetContextWSGIMiddleware

__all__ = ["HEADER", "BudgetContextMiddleware", "BudgetContextWSGIMiddleware"]


def __getattr__(name: str) -> object:
    # The ASGI middleware needs anyio (installed with starlette or httpx); a WSGI-only
    # service should not have to install it.
    if name == "BudgetContextMiddleware":
        from .asgi import BudgetContextMiddleware

        return BudgetContextMiddleware
    raise AttributeError(name)
