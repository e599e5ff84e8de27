"""``budgeted(client)``: one line that budgets every LLM request of an official provider
SDK client (``OpenAI``, ``AsyncOpenAI``, ``Anthropic``, ``AsyncAnthropic``, and what is
built on them), or of an ``httpx2`` client, by putting the budget transport under it."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

import httpx2

from ..context.execution import ExecutionContext
from .async_transport import AsyncBudgetTransport
from .errors import BudgetExceededError, flavoured
from .prepare import TransportSettings
from .transport import BudgetTransport

C = TypeVar("C")
_SDK_ERRORS = {"openai": "OpenAIError", "anthropic": "AnthropicError"}


def budgeted(client: C, *, context: ExecutionContext | None = None,
             settings: TransportSettings | None = None,
             default_output_tokens: int | None = None) -> C:
    """Budget every LLM request ``client`` sends (returns the same client).

    Each request to a known endpoint (OpenAI chat completions, responses, embeddings and
    completions on any base URL; Anthropic messages) runs as a wrapped call of
    ``context``, or of ``current_context()`` when the request is made; outside any
    context it is sent unbudgeted (``TransportSettings(require_context=True)`` refuses it
    instead). A refusal raises :class:`BudgetExceededError` (for an SDK client, a subclass
    that is also the SDK's own base error, so the SDK neither wraps nor retries it).
    ``default_output_tokens`` is a shortcut for the setting of that name. Calling it
    again on the same client replaces the context and settings."""
    if default_output_tokens is not None:
        settings = TransportSettings(default_output_tokens=default_output_tokens,
                                     require_context=bool(settings and
                                                          settings.require_context),
                                     operation_name=settings.operation_name
                                     if settings else None)
    http = client if isinstance(client, (httpx2.Client, httpx2.AsyncClient)) else getattr(
        client, "_client", None)
    error_class = _error_class(client)
    if isinstance(http, httpx2.Client):
        http._transport = _sync(http._transport, context, settings, error_class)
        http._mounts = {k: None if t is None else _sync(t, context, settings, error_class)
                        for k, t in http._mounts.items()}
    elif isinstance(http, httpx2.AsyncClient):
        http._transport = _async(http._transport, context, settings, error_class)
        http._mounts = {k: None if t is None else _async(t, context, settings, error_class)
                        for k, t in http._mounts.items()}
    else:
        raise TypeError(f"budgeted() takes an OpenAI or Anthropic client (sync or async) or "
                        f"an httpx2 client; got {type(client).__name__}")
    return client


def _sync(inner: httpx2.BaseTransport, context: ExecutionContext | None,
          settings: TransportSettings | None, error_class: type[BudgetExceededError]
          ) -> BudgetTransport:
    if isinstance(inner, BudgetTransport):
        inner = inner.inner
    return BudgetTransport(inner, context=context, settings=settings,
                           error_class=error_class)


def _async(inner: httpx2.AsyncBaseTransport, context: ExecutionContext | None,
           settings: TransportSettings | None, error_class: type[BudgetExceededError]
           ) -> AsyncBudgetTransport:
    if isinstance(inner, AsyncBudgetTransport):
        inner = inner.inner
    return AsyncBudgetTransport(inner, context=context, settings=settings,
                                error_class=error_class)


def _error_class(client: Any) -> type[BudgetExceededError]:
    """The refusal's class for ``client``'s SDK: also its base error, if it has one."""
    for cls in type(client).__mro__:
        sdk = str(getattr(cls, "__module__", "")).partition(".")[0]
        if sdk in _SDK_ERRORS:
            base = getattr(importlib.import_module(sdk), _SDK_ERRORS[sdk])
            return flavoured(base)
    return BudgetExceededError
