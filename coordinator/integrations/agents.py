"""What the framework hooks share: a child context named after an agent (``budgetctl
tree`` shows the name), and a tool call run as a wrapped tool call that returns the
tool's result or raises (the tool's own error, or ``BudgetExceededError``)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..context.execution import ExecutionContext, current_context
from ..context.wrap import run_async, run_sync
from ..models import ChainMetadata, Decision, WrapOptions
from .errors import BudgetExceededError


def parent_context(name: str, parent: ExecutionContext | None) -> ExecutionContext:
    """``parent``, else the current context; ``BudgetExceededError`` (reason
    ``no_context``) when there is none."""
    above = parent if parent is not None else current_context()
    if above is None:
        raise BudgetExceededError(decision=Decision.HALT, reason="no_context",
                                  detail=f"agent {name!r} runs outside any context",
                                  chain_id="", snapshot=None)
    return above


def _metadata(name: str, above: ExecutionContext) -> ChainMetadata:
    return ChainMetadata(request_id=above.metadata.request_id, chain_id=uuid.uuid4().hex,
                         service=name[:100], tags={"agent": name[:100]})


def agent_context(name: str, parent: ExecutionContext | None = None, *,
                  max_cost_usd: float | None = None) -> ExecutionContext:
    """A child of ``parent`` (default: the current context) for one agent, named
    ``name``; its cost limit is what remains above unless ``max_cost_usd`` is given.
    Raises ``BudgetExceededError`` (reason ``no_context``) outside any context."""
    above = parent_context(name, parent)
    return above.spawn_child(max_cost_usd=max_cost_usd, metadata=_metadata(name, above))


async def aagent_context(name: str, parent: ExecutionContext | None = None, *,
                         max_cost_usd: float | None = None) -> ExecutionContext:
    """:func:`agent_context` opened off the event loop."""
    above = parent_context(name, parent)
    child: ExecutionContext = await above.aspawn_child(
        max_cost_usd=max_cost_usd, metadata=_metadata(name, above))
    return child


def result_of(ctx: ExecutionContext, outcome: Any) -> Any:
    """A wrap's result; its function's own error, or ``BudgetExceededError`` for a
    refusal."""
    if outcome.decision == Decision.ALLOW:
        return outcome.result
    if outcome.error is not None and outcome.reason is None:
        raise outcome.error  # the tool failed (counted under the retry rules)
    raise BudgetExceededError(decision=outcome.decision,
                              reason=outcome.reason or outcome.decision.value.lower(),
                              detail=outcome.detail, chain_id=ctx.chain_id,
                              snapshot=None) from outcome.error


def tool_call(ctx: ExecutionContext, name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` as a wrapped tool call of ``ctx`` named ``tool <name>``."""
    options = WrapOptions(operation_name=f"tool {name}"[:100])
    return result_of(ctx, run_sync(ctx._state, ctx, "tool", fn, options))


async def atool_call(ctx: ExecutionContext, name: str,
                     fn: Callable[[], Awaitable[Any]]) -> Any:
    """The async twin of :func:`tool_call`."""
    options = WrapOptions(operation_name=f"tool {name}"[:100])
    return result_of(ctx, await run_async(ctx._state, ctx, "tool", fn, options))
