"""LiteLLM in-process (extra ``litellm``): ``completion``/``acompletion`` that run
``litellm.completion``/``acompletion`` as a wrapped call of the current context, reserved
from the arguments (model price, input size, output limit), run on the model the
context's ladder chose (docs/degrade.md; the ladder names models as the call does:
``openai/gpt-4o``) and settled from the response (LiteLLM's ``response_cost`` where it
states one, else its usage priced). Any provider LiteLLM reaches is covered; a refusal
raises ``BudgetExceededError`` before LiteLLM is called (LiteLLM maps the exceptions its
providers raise, so a refusal raised under it, by the transport, would reach the caller
as a provider error)."""

from __future__ import annotations

from typing import Any

import litellm

from ..context.call import active_call
from ..context.execution import ExecutionContext
from ..context.wrap import run_async, run_sync
from ..models import WrapOptions
from .agents import parent_context, result_of
from .request_plan import OUTPUT_FIELDS, plan_body


def _options(kwargs: dict[str, Any], default_output_tokens: int | None) -> WrapOptions:
    model = kwargs.get("model")
    body = {"model": model, "messages": kwargs.get("messages"),
            **{f: kwargs[f] for f in OUTPUT_FIELDS if f in kwargs}}
    prefix, _, rest = str(model or "").partition("/")
    provider = prefix if rest and prefix.isidentifier() else "openai"
    plan = plan_body(body, "chat", provider, default_output_tokens=default_output_tokens)
    return plan.options()


def _chosen(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` naming the model the running call's ladder chose, if another."""
    call = active_call.get()
    model = call.model if call is not None else None
    if model is None or model == kwargs.get("model"):
        return kwargs
    return {**kwargs, "model": model}


def completion(*, context: ExecutionContext | None = None,
               default_output_tokens: int | None = None, **kwargs: Any) -> Any:
    """``litellm.completion(**kwargs)`` as a wrapped LLM call of ``context`` (default: the
    current one). Raises ``BudgetExceededError`` when refused, LiteLLM's error when the
    call failed (counted under the retry rules)."""
    ctx = parent_context("litellm", context)
    options = _options(kwargs, default_output_tokens)
    return result_of(ctx, run_sync(ctx._state, ctx, "llm",
                                   lambda: litellm.completion(**_chosen(kwargs)), options))


async def acompletion(*, context: ExecutionContext | None = None,
                      default_output_tokens: int | None = None, **kwargs: Any) -> Any:
    """The async twin of :func:`completion` (``litellm.acompletion``)."""
    ctx = parent_context("litellm", context)
    options = _options(kwargs, default_output_tokens)
    return result_of(ctx, await run_async(ctx._state, ctx, "llm",
                                          lambda: litellm.acompletion(**_chosen(kwargs)),
                                          options))
