"""pydantic-ai (extra ``pydantic-ai``): an agent run as a child context named after the
agent, its tool calls as wrapped tool calls (``BudgetedToolset``). The model's requests
are budgeted by the transport under its client (``budgeted(AsyncOpenAI())`` given to the
provider): they run in the task of the run, so they see its context."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from ..context.execution import ExecutionContext, current_context
from .agents import aagent_context, atool_call


class BudgetedToolset(WrapperToolset[Any]):
    """Each call of a tool of ``wrapped`` is a wrapped tool call of the current context
    (sent as it is outside any context)."""

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        budget = current_context()
        if budget is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return await atool_call(budget, name,
                                lambda: self.wrapped.call_tool(name, tool_args, ctx, tool))


def budgeted_toolset(toolset: AbstractToolset[Any]) -> BudgetedToolset:
    """``toolset`` with its calls budgeted."""
    return BudgetedToolset(toolset)


async def run_agent(agent: Agent[Any, Any], user_prompt: str, *,
                    context: ExecutionContext | None = None,
                    max_cost_usd: float | None = None, **run_options: Any) -> Any:
    """``agent.run(user_prompt)`` in a child context named after the agent (of
    ``context``, default the current one); returns the run's result. The child is
    closed when the run ends."""
    child = await aagent_context(agent.name or "agent", context, max_cost_usd=max_cost_usd)
    async with child:
        return await agent.run(user_prompt, **run_options)
