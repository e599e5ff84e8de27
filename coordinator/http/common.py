"""What both middlewares share: their settings, which context a request runs in, and how
a refused request is answered (a JSON body with a 4xx status, never a 500)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any, Generic, TypeVar

from ..context import tracing
from ..context.execution import ExecutionContext, current_context
from ..errors import (
    BackendUnavailableError,
    ContextNotFoundError,
    TokenError,
    TokenMalformedError,
    TokenMissingError,
)
from ..models import ExecutionConfig
from ..runtime.coordinator import Coordinator
from ..store.errors import RedisError

log = logging.getLogger("coordinator.http")

HEADER = "budget-context"
"""The HTTP header that carries a context token (see docs/http.md for its format)."""

_UNREACHABLE = (RedisError, OSError)
_DEFAULT_PORTS = {"http": 80, "https": 443}

App = TypeVar("App")


class ContextMiddleware(Generic[App]):
    """The settings of a middleware around ``app`` (ASGI or WSGI): how each request finds
    its context."""

    def __init__(
        self,
        app: App,
        *,
        coordinator: Coordinator | None = None,
        config: ExecutionConfig | None = None,
        require_context: bool = False,
    ) -> None:
        self.app = app
        self.coordinator = coordinator
        """None: :meth:`Coordinator.default` at each request."""
        self.config = config
        """Limits of the root context opened for a request without a header (None: the
        request runs without a context)."""
        self.require_context = require_context
        """Refuse requests without a header (401) instead of opening a root."""


class RequestRefused(Exception):
    """A request that must be answered with ``status`` and a JSON ``body`` instead of
    reaching the application."""

    def __init__(self, status: int, body: dict[str, object]) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{status} {body}")

    def body_bytes(self) -> bytes:
        return json.dumps(self.body).encode()


def error_code(exc: BaseException) -> str:
    """``TokenExpiredError`` -> ``token_expired``: a stable, machine-readable code."""
    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _refusal(exc: BaseException) -> RequestRefused:
    if isinstance(exc, TokenError):
        status = exc.status_code
    elif isinstance(exc, ContextNotFoundError):
        status = 404
    else:
        # Redis host names and errors are for the logs, not for the caller.
        log.warning("refusing a request: %s", exc)
        return RequestRefused(503, {"error": error_code(exc), "status": 503,
                                    "detail": "the budget store is unreachable; retry later"})
    return RequestRefused(status, {"error": error_code(exc), "detail": str(exc),
                                   "status": status})


def resolve(
    values: Sequence[str],
    coordinator: Coordinator,
    config: ExecutionConfig | None,
    require_context: bool,
) -> ExecutionContext | None:
    """The context a request runs in: a handle attached from the header, else a root
    opened with ``config`` (closed when the request ends), else None. Raises
    :class:`RequestRefused` for a bad or missing token; nothing is charged then."""
    try:
        if len(values) > 1:
            raise TokenMalformedError(f"{len(values)} {HEADER} headers, expected one")
        if values:
            return ExecutionContext.attach(values[0], coordinator)
        if config is not None:
            return ExecutionContext(config, coordinator=coordinator)
        if require_context:
            raise TokenMissingError(f"this service requires a {HEADER} header")
        return None
    except (TokenError, ContextNotFoundError) as exc:
        raise _refusal(exc) from None
    except _UNREACHABLE as exc:
        raise _refusal(BackendUnavailableError("attach", exc)) from None


def flush(coordinator: Coordinator) -> None:
    """Send the queued settles of this process, so that the caller sees the spend once it
    has the response. A failure only delays them (the background flush retries)."""
    try:
        coordinator.store.flush()
    except _UNREACHABLE as exc:
        log.warning("could not flush before the response: %s", exc)


def finish(ctx: ExecutionContext) -> None:
    """End the request's use of ``ctx``: an attached handle is flushed and dropped, a root
    opened for the request is closed in Redis."""
    try:
        ctx.close()
    except _UNREACHABLE as exc:
        log.warning("closing the request's context %s: %s", ctx.chain_id, exc)


class HostPolicy:
    """Which hosts receive the header: ``host`` or ``host:port`` entries, ``*`` for all.
    Any other host has the header removed (a redirect copies headers; the token must not
    follow it to a third party)."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = frozenset(h.strip().lower() for h in hosts if h.strip())
        if not self._hosts:
            raise ValueError("name the hosts that may receive the budget-context header "
                             "(or '*' for every host)")

    def allows(self, scheme: str, host: str, port: int | None) -> bool:
        host = host.lower()
        port = port or _DEFAULT_PORTS.get(scheme.lower())
        return "*" in self._hosts or host in self._hosts or f"{host}:{port}" in self._hosts

    def apply(self, scheme: str, host: str, port: int | None,
              headers: MutableMapping[str, Any]) -> None:
        """Set the header from the current context, or strip it for a foreign host."""
        if not self.allows(scheme, host, port):
            headers.pop(HEADER, None)
            return
        ctx = current_context()
        if ctx is not None:
            headers[HEADER] = ctx.token
            tracing.inject(headers)  # one trace across the tree (no-op without tracing)
