"""The OpenAI Agents SDK (extra ``openai-agents``): a run becomes a context tree, one
child per agent (named after it; an agent handed off to is a child of the agent that
handed off), each tool call a wrapped tool call of its agent's child. The SDK's run
hooks run in tasks of their own, so a context set in a hook would not reach the model
call: the agents' models are wrapped instead, making the agent's child current around
each model call (the transport under the model's client then charges it there)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

from agents import Agent, FunctionTool, Model, Runner, RunResult

from ..context.execution import ExecutionContext, active_context, current_context
from .agents import aagent_context, atool_call, parent_context


class _Run:
    """The contexts of one run: the parent, and a child per agent name."""

    def __init__(self, parent: ExecutionContext) -> None:
        self.parent = parent
        self.children: dict[str, ExecutionContext] = {}
        self.handed_by: dict[str, str] = {}
        """Agent name -> the agent that hands off to it (its context's parent)."""
        self.lock = asyncio.Lock()

    async def child(self, name: str) -> ExecutionContext:
        async with self.lock:
            return await self._child(name, set())

    async def _child(self, name: str, seen: set[str]) -> ExecutionContext:
        ctx = self.children.get(name)
        if ctx is None:
            by = self.handed_by.get(name)
            parent = self.parent if by is None or by in seen else await self._child(
                by, seen | {name})
            ctx = self.children[name] = await aagent_context(name, parent)
        return ctx

    async def aclose(self) -> None:
        for ctx in self.children.values():
            await ctx.aclose()


_run: ContextVar[_Run | None] = ContextVar("budget_agents_run", default=None)


async def _context_of(agent_name: str) -> ExecutionContext | None:
    run = _run.get()
    return await run.child(agent_name) if run is not None else current_context()


class BudgetedModel(Model):
    """An agent's model whose calls run with the agent's child context current."""

    def __init__(self, inner: Model, agent_name: str) -> None:
        self.inner = inner
        self.agent_name = agent_name

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        ctx = await _context_of(self.agent_name)
        token = active_context.set(ctx)
        try:
            return await self.inner.get_response(*args, **kwargs)
        finally:
            active_context.reset(token)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._stream(args, kwargs)

    async def _stream(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> AsyncIterator[Any]:
        ctx = await _context_of(self.agent_name)
        token = active_context.set(ctx)
        try:
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event
        finally:
            try:
                active_context.reset(token)
            except ValueError:  # iterated from another task: its context is its own
                pass


def _budgeted_tool(tool: Any, agent_name: str) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool
    invoke = tool.on_invoke_tool

    async def budgeted_invoke(tool_context: Any, arguments: str) -> Any:
        ctx = await _context_of(agent_name)
        if ctx is None:
            return await invoke(tool_context, arguments)
        return await atool_call(ctx, tool.name, lambda: invoke(tool_context, arguments))

    return dataclasses.replace(tool, on_invoke_tool=budgeted_invoke)


def budget_agents(agent: Agent[Any], _done: dict[int, Agent[Any]] | None = None,
                  handed_by: dict[str, str] | None = None) -> Agent[Any]:
    """A copy of ``agent`` and of every agent it hands off to, their models and function
    tools budgeted. Each agent's ``model`` must be a ``Model`` instance (for instance
    ``OpenAIChatCompletionsModel(model, openai_client=budgeted(AsyncOpenAI()))``).
    ``handed_by`` receives, for each handoff target, the agent handing off to it."""
    done = {} if _done is None else _done
    handed_by = {} if handed_by is None else handed_by
    if id(agent) in done:
        return done[id(agent)]
    if not isinstance(agent.model, Model):
        raise TypeError(f"agent {agent.name!r}: give it a Model instance whose client is "
                        f"budgeted, not {agent.model!r}")
    copy = agent.clone(model=BudgetedModel(agent.model, agent.name),
                       tools=[_budgeted_tool(t, agent.name) for t in agent.tools])
    done[id(agent)] = copy
    # (a Handoff object keeps the agent it was made for: hand off to agents to budget them)
    for h in agent.handoffs:
        if isinstance(h, Agent):
            handed_by.setdefault(h.name, agent.name)
    copy.handoffs = [budget_agents(h, done, handed_by) if isinstance(h, Agent) else h
                     for h in agent.handoffs]
    return copy


async def run_agents(agent: Agent[Any], run_input: Any, *,
                     context: ExecutionContext | None = None,
                     **run_options: Any) -> RunResult:
    """``Runner.run(agent, run_input)`` as a context tree under ``context`` (default: the
    current one): one child per agent that runs, tool calls as wrapped tool calls. The
    children are closed when the run ends."""
    run = _Run(parent_context(agent.name, context))
    token = _run.set(run)
    try:
        budgeted_agent = budget_agents(agent, handed_by=run.handed_by)
        return await Runner.run(budgeted_agent, run_input, **run_options)
    finally:
        _run.reset(token)
        await run.aclose()
