"""ASGI middleware (Starlette, FastAPI, any ASGI app): run each request inside the
context named by its ``budget-context`` header."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio.to_thread

from ..context import tracing
from ..context.execution import active_context
from ..runtime.coordinator import Coordinator
from .common import HEADER, ContextMiddleware, RequestRefused, finish, flush, resolve

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADER_BYTES = HEADER.encode()
_TRACE_HEADERS = (b"traceparent", b"tracestate")


class BudgetContextMiddleware(ContextMiddleware[ASGIApp]):
    """Attach the caller's context for each HTTP request (``current_context()`` returns it
    in the handler), or open a root context with ``config`` when no header came.

    A bad token is answered 400/401 (403 for another tenant, 404 for a context that no
    longer exists) with a JSON body ``{"error", "detail", "status"}``; the application is
    not called and nothing is charged. Queued settles are flushed before the last body
    chunk is sent, so the caller sees the spend as soon as it has the response.

    ``app.add_middleware(BudgetContextMiddleware, coordinator=..., config=...)``.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        coord = self.coordinator or Coordinator.default()
        values = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER_BYTES]
        try:
            # attach/open are blocking Redis round trips: keep them off the event loop.
            ctx = await anyio.to_thread.run_sync(
                resolve, values, coord, self.config, self.require_context)
        except RequestRefused as refused:
            await _send_json(send, refused)
            return
        if ctx is None:
            await self.app(scope, receive, send)
            return

        async def send_after_flush(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                await anyio.to_thread.run_sync(flush, coord)
            await send(message)

        trace = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                 if k.lower() in _TRACE_HEADERS}
        var = active_context.set(ctx)
        try:
            with tracing.extracted(trace):
                await self.app(scope, receive, send_after_flush)
        finally:
            active_context.reset(var)
            await anyio.to_thread.run_sync(finish, ctx)


async def _send_json(send: Send, refused: RequestRefused) -> None:
    body = refused.body_bytes()
    await send({
        "type": "http.response.start",
        "status": refused.status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
