# Generated from async_transport.py by tests/support/unasync.py: edit that file, then run
# `python -m tests.support.unasync`.
"""``BudgetTransport``: an ``httpx2`` transport that budgets every request to a known
LLM endpoint. Each request is one wrapped call: reserved from its body before a byte is
sent, sent on the model its ladder chose (docs/degrade.md: the body's ``model`` rewritten
when that is another), settled from its response's usage, a stream metered event by event
and cut at what the call holds, an abort shutting its connection down (also while it
waits for the response's headers). Any other request passes through untouched. The
call's steps are driven by ``run_steps`` and the request is sent by ``send_request``
(transport_io.py). transport.py is generated from async_transport.py
(tests/support/unasync.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2

from ..context.call import Outcome
from ..context.cancellation import CancelledByContext
from ..context.execution import ExecutionContext
from ..models import Decision
from .errors import BudgetExceededError
from .exchange import Exchange, ProviderError, cut_connection
from .prepare import TransportSettings, is_event_stream, parse_body, rebuilt_response, with_model
from .sse import EventSplitter
from .transport_io import exchange_for, run_steps, send_request


class BudgetTransport(httpx2.BaseTransport):
    """Budgets the LLM requests sent through ``inner`` (default: a new
    ``httpx2.HTTPTransport``) under ``context`` (default: ``current_context()`` at
    each request). A refusal raises ``error_class`` (a :class:`BudgetExceededError`)."""

    def __init__(self, inner: httpx2.BaseTransport | None = None, *,
                 context: ExecutionContext | None = None,
                 settings: TransportSettings | None = None,
                 error_class: type[BudgetExceededError] = BudgetExceededError) -> None:
        self.inner = inner if inner is not None else httpx2.HTTPTransport()
        self.context = context
        self.settings = settings or TransportSettings()
        self.error_class = error_class

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        budgeted = exchange_for(request, self.context, self.settings, self.error_class)
        if budgeted is None:
            return self.inner.handle_request(request)
        ex, ctx, request = budgeted
        started = run_steps(ex, ex.begin())
        if isinstance(started, Outcome):
            raise ex.refusal(started, _snapshot(ctx))
        request = with_model(request, ex.plan, started.model)  # the ladder's choice
        response = send_request(ex, self.inner, request, _failed)
        if response.status_code >= 400 or not (ex.plan.stream and is_event_stream(response)):
            raw = _read(ex, response)
            if response.status_code >= 400:
                outcome = run_steps(ex, ex.fail(ProviderError(response.status_code)))
                if ex.stops(outcome):
                    raise ex.refusal(outcome or Outcome(Decision.HALT), _snapshot(ctx))
            else:
                run_steps(ex, ex.complete(parse_body(response.headers, raw)))
            return rebuilt_response(response, raw)
        ex.start_stream()
        return httpx2.Response(response.status_code, headers=response.headers,
                               stream=MeteredBody(ex, response),
                               extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


def _read(ex: Exchange, response: httpx2.Response) -> bytes:
    """The whole raw body; an abort while it is read shuts the connection down."""
    assert ex.call is not None
    unhook = ex.call.token.on_cancel(lambda _reason: cut_connection(response.extensions))
    try:
        return b"".join([c for c in response.stream])  # type: ignore[union-attr]
    except BaseException as exc:  # noqa: BLE001 - every outcome must settle
        raise _failed(ex, exc) from exc
    finally:
        unhook()
        response.close()


def _failed(ex: Exchange, exc: BaseException) -> BaseException:
    """Settle a request that failed; the error to raise: the refusal when it was aborted
    or spent the retry budget, else the failure itself (the SDK retries it)."""
    assert ex.call is not None
    token = ex.call.token
    if token.cancelled:
        exc = CancelledByContext(token.reason or "cancelled")
    outcome = run_steps(ex, ex.fail(exc))
    if ex.stops(outcome) or isinstance(exc, CancelledByContext):
        return ex.refusal(outcome or Outcome(Decision.HALT, reason="aborted"),
                          _snapshot(ex.ctx))
    return exc


def _snapshot(ctx: ExecutionContext) -> Any:
    try:
        return ctx.get_snapshot()
    except Exception:  # noqa: BLE001 - the refusal is raised without one
        return None


class MeteredBody(httpx2.SyncByteStream):
    """A streamed response's bytes, handed on as they are metered (the events each network
    chunk completes, in one piece); the call settles when the stream ends, is cut, is
    closed by its reader, or fails."""

    def __init__(self, ex: Exchange, response: httpx2.Response) -> None:
        self.ex = ex
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        ex, call = self.ex, self.ex.call
        assert call is not None
        splitter = EventSplitter(text_deltas=True)  # metered by their text alone
        unhook = call.token.on_cancel(lambda _r: cut_connection(self.response.extensions))
        try:
            for chunk in self.response.stream:  # type: ignore[union-attr]
                passed, cut = ex.meter_chunk(splitter, chunk)
                if passed:
                    yield passed
                if cut:
                    self.close()
                    return
                if call.token.cancelled:  # an HTTP/2 stream, whose connection is not cut
                    break
            if call.token.cancelled:  # the abort shut the connection, or was seen between reads
                raise CancelledByContext(call.token.reason or "cancelled")
            rest = splitter.rest()
            if rest:
                yield rest
        except GeneratorExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every outcome must settle
            if not ex.finished:
                self.response.close()
                raise _failed(ex, exc) from exc
            raise
        finally:
            unhook()
        self.close()

    def close(self) -> None:
        """Close the provider's stream; the call is charged what it metered."""
        self.response.close()
        if not self.ex.finished:
            run_steps(self.ex, self.ex.complete(None))
