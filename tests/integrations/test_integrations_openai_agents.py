"""The OpenAI Agents SDK over real HTTP to the local provider: a triage agent handing off
to a weather agent with a tool becomes a context tree (a child per agent, named after it;
the tool call a wrapped tool call of the weather agent's child), is refused at a $0.05
ceiling with the typed error, and its spend and tree show in ``budgetctl tree``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    function_tool,
    set_tracing_disabled,
)

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, current_context
from coordinator.cli.tree import tree_text
from coordinator.core.amounts import usd_to_micro
from coordinator.integrations import BudgetExceededError, budgeted
from coordinator.integrations.openai_agents import run_agents
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    set_tracing_disabled(True)  # the SDK's own traces would go to OpenAI
    s = ProviderServer()
    yield s
    s.stop()


TOOL_CONTEXTS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    ctx = current_context()
    assert ctx is not None
    TOOL_CONTEXTS.append(ctx.chain_id)  # the tool call runs in the weather agent's child
    return f"sunny in {city}"


def test_a_handoff_and_a_tool_make_a_context_tree(coord: Coordinator,
                                                  server: ProviderServer) -> None:
    async def scenario() -> tuple[ExecutionContext, int, BaseException]:
        client = budgeted(openai.AsyncOpenAI(base_url=server.openai_url, api_key="k",
                                             max_retries=0))
        model = OpenAIChatCompletionsModel(model="gpt-4", openai_client=client)
        settings = ModelSettings(max_tokens=50)
        weather = Agent(name="weather", instructions="Answer about the weather.",
                        model=model, model_settings=settings, tools=[get_weather])
        triage = Agent(name="triage", instructions="Hand weather questions off.",
                       model=model, model_settings=settings, handoffs=[weather])
        root = ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=1000,
                                                max_retries_total=5))
        async with client, root:
            result = await run_agents(triage, "What is the weather in Paris?")
            assert result.final_output == "abcd" * 20
            assert result.last_agent.name == "weather"
            runs = 1
            with pytest.raises(BudgetExceededError) as err:
                while True:
                    await run_agents(triage, "And in Lisbon?")
                    runs += 1
        return root, runs, err.value

    root, runs, error = asyncio.run(scenario())
    assert error.reason == "budget_exceeded"
    used = check_tree(coord.client, root.chain_id)
    snap = root.get_snapshot()
    assert used == usd_to_micro(snap.cost_usd_accumulated) <= 50_000
    text = tree_text(coord, root.chain_id)
    assert text.count("triage") == runs + 1
    assert text.count("weather") >= runs
    weather_ctx = ExecutionContext.load_snapshot(TOOL_CONTEXTS[0])
    assert [n.kind for n in weather_ctx.nodes] == ["llm", "tool", "llm"]
    assert weather_ctx.nodes[1].operation_name == "tool get_weather"
    # the handoff made the weather agent a child of the triage agent's context
    triage_ctx = ExecutionContext.load_snapshot(weather_ctx.parent_chain_id or "")
    assert triage_ctx.parent_chain_id == root.chain_id
    assert [n.kind for n in triage_ctx.nodes] == ["llm"]
