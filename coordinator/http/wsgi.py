"""WSGI middleware (Flask, Django, any WSGI app): run each request inside the context
named by its ``budget-context`` header."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..context import tracing
from ..context.execution import ExecutionContext, active_context
from ..runtime.coordinator import Coordinator
from .common import ContextMiddleware, RequestRefused, finish, flush, resolve

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_STATUS_TEXT = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                404: "Not Found", 503: "Service Unavailable"}


class BudgetContextWSGIMiddleware(ContextMiddleware[WSGIApp]):
    """The WSGI twin of :class:`~coordinator.http.asgi.BudgetContextMiddleware`:
    ``app.wsgi_app = BudgetContextWSGIMiddleware(app.wsgi_app, config=...)``.

    The context is current while the application runs and while its body is iterated;
    queued settles are flushed before the last body chunk goes out.
    """

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        coord = self.coordinator or Coordinator.default()
        # WSGI servers join repeated headers with commas, which no token contains: a
        # repeated header is refused as malformed by the decoder.
        value = environ.get("HTTP_BUDGET_CONTEXT")
        try:
            ctx = resolve([] if value is None else [value], coord, self.config,
                                  self.require_context)
        except RequestRefused as refused:
            body = refused.body_bytes()
            start_response(f"{refused.status} {_STATUS_TEXT.get(refused.status, 'Error')}",
                           [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body)))])
            return [body]
        if ctx is None:
            return self.app(environ, start_response)
        var = active_context.set(ctx)
        trace = {"traceparent": environ.get("HTTP_TRACEPARENT"),
                 "tracestate": environ.get("HTTP_TRACESTATE")}
        try:
            with tracing.extracted(trace):
                result = self.app(environ, start_response)
        except BaseException:
            finish(ctx)
            raise
        finally:
            active_context.reset(var)
        return _Body(result, ctx, coord)


class _Body:
    """The application's body, iterated inside the request's context; the context is
    finished when the server closes the body (PEP 3333 guarantees that call)."""

    def __init__(self, result: Iterable[bytes], ctx: ExecutionContext,
                 coord: Coordinator) -> None:
        self._result = result
        self._ctx = ctx
        self._coord = coord

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._result)
        held: bytes | None = None
        while True:
            var = active_context.set(self._ctx)
            try:
                chunk = next(chunks, None)
            finally:
                active_context.reset(var)
            if chunk is None:
                break
            if held is not None:
                yield held
            held = chunk  # one chunk of look-ahead: flush before the last one leaves
        flush(self._coord)
        if held is not None:
            yield held

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            finish(self._ctx)
