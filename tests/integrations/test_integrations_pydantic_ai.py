"""pydantic-ai over real HTTP to the local provider: an agent with a tool, its model's
client budgeted, runs as a child context named after it (its tool call a wrapped tool
call), is refused at a $0.05 ceiling with the typed error, and its spend and tree show in
``budgetctl tree``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.toolsets import FunctionToolset

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, current_context
from coordinator.cli.tree import tree_text
from coordinator.core.amounts import usd_to_micro
from coordinator.integrations import BudgetExceededError, budgeted
from coordinator.integrations.pydantic_ai import BudgetedToolset, budgeted_toolset, run_agent
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


AGENT_CONTEXTS: list[str] = []


def get_weather(city: str) -> str:
    """The weather in a city."""
    ctx = current_context()
    assert ctx is not None
    AGENT_CONTEXTS.append(ctx.chain_id)  # the tool runs in the agent's child context
    return f"sunny in {city}"


def test_an_agent_with_a_tool_runs_under_a_ceiling(coord: Coordinator,
                                                   server: ProviderServer) -> None:
    async def scenario() -> tuple[ExecutionContext, int, BaseException]:
        client = budgeted(openai.AsyncOpenAI(base_url=server.openai_url, api_key="k",
                                             max_retries=0))
        model = OpenAIChatModel("gpt-4", provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, name="forecaster", model_settings={"max_tokens": 50},
                      toolsets=[BudgetedToolset(FunctionToolset([get_weather]))])
        root = ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=1000,
                                                max_retries_total=5))
        async with client, root:
            result = await run_agent(agent, "What is the weather in Paris?")
            assert result.output == "abcd" * 20
            runs = 1
            with pytest.raises(BudgetExceededError) as err:
                while True:
                    await run_agent(agent, "And in Lisbon?")
                    runs += 1
        return root, runs, err.value

    root, runs, error = asyncio.run(scenario())
    assert error.reason == "budget_exceeded" and isinstance(error, openai.OpenAIError)
    served = server.provider.stats()
    assert all(s["status"] == 200 for s in served)
    snap = root.get_snapshot()
    used = check_tree(coord.client, root.chain_id)
    assert used == usd_to_micro(snap.cost_usd_accumulated) <= 50_000
    text = tree_text(coord, root.chain_id)
    assert text.count("forecaster") == runs + 1  # one child per run, the refused one too
    first = ExecutionContext.load_snapshot(AGENT_CONTEXTS[0])
    assert first.parent_chain_id == root.chain_id
    kinds = sorted((n.kind, n.operation_name.split()[0]) for n in first.nodes)
    assert kinds == [("llm", "chat"), ("llm", "chat"), ("tool", "tool")]
    assert [n.operation_name for n in first.nodes if n.kind == "tool"] == ["tool get_weather"]



def test_budgeted_toolset_makes_each_tool_call_a_wrapped_call(coord: Coordinator,
                                                             server: ProviderServer) -> None:
    """``budgeted_toolset``: a tool call is a wrapped tool call of the current context,
    refused (the tool never runs) when the context cannot take it, and run as it is
    outside any context."""
    ran: list[str | None] = []

    def lookup(city: str) -> str:
        """The weather in a city."""
        ctx = current_context()
        ran.append(ctx.chain_id if ctx is not None else None)
        return f"sunny in {city}"

    def config(steps: int) -> ExecutionConfig:
        return ExecutionConfig(max_cost_usd=1.0, max_steps=steps, max_retries_total=3)

    async def scenario() -> tuple[ExecutionContext, ExecutionContext, BaseException]:
        client = budgeted(openai.AsyncOpenAI(base_url=server.openai_url, api_key="k",
                                             max_retries=0))
        model = OpenAIChatModel("gpt-4", provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, model_settings={"max_tokens": 50},
                      toolsets=[budgeted_toolset(FunctionToolset([lookup]))])
        async with client:
            async with ExecutionContext(config(10)) as done:
                assert (await agent.run("Weather in Paris?")).output == "abcd" * 20
            # one step: the model's request takes it, the tool call is refused
            with pytest.raises(BudgetExceededError) as err:
                async with ExecutionContext(config(1)) as refused:
                    await agent.run("Weather in Lisbon?")
            assert (await agent.run("Weather in Porto?")).output == "abcd" * 20
        return done, refused, err.value

    done, refused, error = asyncio.run(scenario())
    assert ran == [done.chain_id, None]  # never in the refused context
    assert [(n.kind, n.operation_name, n.status) for n in done.get_snapshot().nodes] == [
        ("llm", "chat gpt-4", "ok"), ("tool", "tool lookup", "ok"),
        ("llm", "chat gpt-4", "ok")]
    assert error.reason == "step_limit_exceeded" and error.chain_id == refused.chain_id
    assert [(n.kind, n.status) for n in refused.get_snapshot().nodes] == [
        ("llm", "ok"), ("tool", "halted")]
    assert len(server.provider.stats()) == 2 + 1 + 2
