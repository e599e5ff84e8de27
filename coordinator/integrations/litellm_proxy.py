"""The LiteLLM proxy's hook (extra ``litellm-proxy``): a proxy enforces a tree's ceiling
from each request's ``budget-context`` header. ``async_pre_call_hook`` attaches the
context and reserves the request's worst case, renaming the request's model to the one
its context's ladder chose (docs/degrade.md; the ladder names the proxy's model names); a
refusal raises the proxy's own error (HTTP 402, ``type`` the stop reason), which the proxy
answers before it calls any provider (an exception raised from a logger's pre-call
*logging* would be swallowed). The post-call hooks settle the call from the response's
usage (a stream's chunks metered as they pass, cut at what the call holds) or as a
failure.

Name the instance in the proxy's ``config.yaml``:
``litellm_settings: {callbacks: coordinator.integrations.litellm_proxy.budget_hook}``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import anyio.to_thread
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import ProxyException

from ..context.call import Outcome
from ..context.executor import Executor
from ..context.steps import Steps, adrive
from ..http.common import HEADER, RequestRefused, finish, resolve
from ..runtime.coordinator import Coordinator
from .errors import BudgetExceededError
from .exchange import Exchange
from .request_plan import plan_body

_KEY = "budget_call"
"""The metadata entry that names a request's open call between the hooks."""


class BudgetProxyHook(CustomLogger):
    """Budgets each proxied chat/completion request under the context its
    ``budget-context`` header names. Without the header a request passes untouched,
    unless ``require_context`` (then 401). ``default_output_tokens``: the output estimate
    of a request that names no limit (default: the model's documented cap)."""

    def __init__(self, coordinator: Coordinator | None = None, *,
                 require_context: bool = False,
                 default_output_tokens: int | None = None) -> None:
        super().__init__()
        self.coordinator = coordinator
        self.require_context = require_context
        self.default_output_tokens = default_output_tokens
        self.open: dict[str, Exchange] = {}
        """The calls reserved and not yet settled, by the id kept in their metadata."""

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any,
                                  data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        if not isinstance(data.get("messages"), list) and "prompt" not in data:
            return data  # not an LLM completion (embeddings, files...): not budgeted
        values = _header_values(data)
        coord = self.coordinator or Coordinator.default()
        try:
            ctx = await anyio.to_thread.run_sync(resolve, values, coord, None,
                                                 self.require_context)
        except RequestRefused as refused:
            raise HTTPException(status_code=refused.status, detail=refused.body) from None
        if ctx is None:
            return data
        ex = Exchange(ctx, self._plan(data), BudgetExceededError, "litellm proxy")
        started = await _run(ex, ex.begin())
        if isinstance(started, Outcome):
            snapshot = await anyio.to_thread.run_sync(ctx.get_snapshot)
            await anyio.to_thread.run_sync(finish, ctx)
            raise _refused(ex.refusal(started, snapshot))
        if started.model is not None and started.model != ex.plan.model:
            data["model"] = _renamed(str(data.get("model") or ""), started.model)
        call_id = uuid.uuid4().hex
        self.open[call_id] = ex
        _metadata(data)[_KEY] = call_id
        return data

    def _plan(self, data: dict[str, Any]) -> Any:
        model = str(data.get("model") or "")
        prefix, _, rest = model.partition("/")
        provider = prefix if rest and prefix.isidentifier() else "openai"
        body = {**data, "model": rest if rest and prefix.isidentifier() else model}
        return plan_body(body, "chat", provider,
                         default_output_tokens=self.default_output_tokens)

    def _take(self, data: dict[str, Any]) -> Exchange | None:
        call_id = _metadata(data).get(_KEY)
        return self.open.pop(call_id, None) if isinstance(call_id, str) else None

    async def async_post_call_success_hook(self, data: dict[str, Any],
                                           user_api_key_dict: Any, response: Any) -> Any:
        ex = self._take(data)
        if ex is not None and not ex.finished:
            await _run(ex, ex.complete(response))
            await anyio.to_thread.run_sync(finish, ex.ctx)
        return response

    async def async_post_call_failure_hook(self, request_data: dict[str, Any],
                                           original_exception: Exception,
                                           user_api_key_dict: Any,
                                           traceback_str: str | None = None) -> None:
        ex = self._take(request_data)
        if ex is not None and not ex.finished:
            await _run(ex, ex.fail(original_exception))
            await anyio.to_thread.run_sync(finish, ex.ctx)

    async def async_post_call_streaming_iterator_hook(
            self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        ex = self._take(request_data)
        if ex is None:
            async for item in response:
                yield item
            return
        ex.start_stream()
        try:
            async for item in response:
                yield item
                dump = getattr(item, "model_dump", None)
                if callable(dump) and ex.observe(dump()):
                    break  # the next chunk could pass the ceiling: cut here
        except BaseException as exc:  # noqa: BLE001 - every outcome must settle
            if not ex.finished:
                await _run(ex, ex.fail(exc))
            raise
        finally:
            if not ex.finished:
                await _run(ex, ex.complete(None))
            await anyio.to_thread.run_sync(finish, ex.ctx)


def _renamed(model: str, chosen: str) -> str:
    """The proxy model name of ``chosen`` (what the ladder chose for ``model``), with
    ``model``'s provider prefix when it has one (as ``_plan`` read it without)."""
    prefix, _, rest = model.partition("/")
    return f"{prefix}/{chosen}" if rest and prefix.isidentifier() else chosen


def _header_values(data: dict[str, Any]) -> list[str]:
    server = data.get("proxy_server_request")
    headers = server.get("headers") if isinstance(server, dict) else None
    if not isinstance(headers, Mapping):
        return []
    return [str(v) for k, v in headers.items() if str(k).lower() == HEADER]


def _metadata(data: dict[str, Any]) -> dict[str, Any]:
    for name in ("metadata", "litellm_metadata"):
        found = data.get(name)
        if isinstance(found, dict):
            return found
    return data.setdefault("metadata", {})  # type: ignore[no-any-return]


def _refused(error: BudgetExceededError) -> ProxyException:
    """The proxy's answer to a refusal: HTTP 402 (the SDKs retry 429 and 5xx, not 402),
    an OpenAI-shaped error whose ``type`` is the stop reason and ``param`` the context."""
    return ProxyException(message=str(error), type=error.reason, param=error.chain_id,
                          code=402)


async def _run(ex: Exchange, steps: Steps[Any]) -> Any:
    return await adrive(steps, Executor(ex.state), ex.state.coord.io)


budget_hook = BudgetProxyHook()
"""The instance a proxy's ``config.yaml`` names (the default coordinator, from the
environment: ``BUDGET_REDIS_URL``...)."""

