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
from coordinator.integrations.pydantic_ai import BudgetedToolset, run_agent
from tests.fake_provider import ProviderServer
from tests.invariants import check_tree


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

