"""The framework integrations at the edge of a budget (issue 31, docs/degrade.md), over
real HTTP to the local provider: ``ctx.finishing()`` entered around a run reaches every
model request and tool call of it (pydantic-ai, the OpenAI Agents SDK's tasks, LangGraph's
worker threads), so a run the final reserve refuses as ordinary work runs as final work;
a model the ladder moves runs on the cheaper rung through the transport; and LangChain's
handler, which cannot switch a chat model, refuses such a call with DEGRADE, sending
nothing and holding nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.toolsets import FunctionToolset

from coordinator import Coordinator, Degrade, ExecutionConfig, ExecutionContext
from coordinator.context.execution import current_call
from coordinator.core import pricing
from coordinator.integrations import BudgetExceededError, budgeted
from coordinator.integrations.langchain import (
    BudgetCallbackHandler,
    budgeted_chat_model,
    run_graph,
)
from coordinator.integrations.openai_agents import run_agents
from coordinator.integrations.pydantic_ai import BudgetedToolset, run_agent
from coordinator.models import Decision
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree
from tests.support.langgraph_weather import weather_graph

FLAT = "flat-test-model"
"""$10 per million output tokens, nothing for input: a request for 1,000 output tokens
holds exactly $0.01 (and costs $0.0002 for the 20 the provider sends)."""
FINAL_CALLS: list[bool] = []
"""Whether each budgeted tool call ran final (``current_call().final``)."""


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    set_tracing_disabled(True)  # the Agents SDK's own traces would go to OpenAI
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture
def provider(server: ProviderServer) -> Iterator[ProviderServer]:
    server.provider.reset()
    FINAL_CALLS.clear()
    pricing.set_price(FLAT, input_per_mtok=0.0, output_per_mtok=10.0)
    yield server
    pricing.clear_prices()


def reserved_root() -> ExecutionContext:
    """$0.05 with a $0.045 final reserve: no ordinary request for 1,000 tokens fits."""
    return ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=1000,
                                            max_retries_total=5, final_reserve_usd=0.045))


def ladder_root() -> ExecutionContext:
    """$0.01: gpt-4o's worst case for 1,000 output tokens ($0.01+) does not fit,
    gpt-4o-mini's does."""
    return ExecutionContext(ExecutionConfig(
        max_cost_usd=0.01, max_steps=1000, max_retries_total=5,
        degrade=Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]})))


def get_weather(city: str) -> str:
    """The weather in a city."""
    info = current_call()
    FINAL_CALLS.append(info is not None and info.final)
    return f"sunny in {city}"


def models_seen(provider: ProviderServer) -> list[str]:
    return [s["model"] for s in provider.provider.stats() if s["status"] == 200]


# -- pydantic-ai ----------------------------------------------------------------------------

def pydantic_agent(client: openai.AsyncOpenAI, model: str) -> PydanticAgent[Any, str]:
    chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
    return PydanticAgent(chat, name="forecaster", model_settings={"max_tokens": 1000},
                         toolsets=[BudgetedToolset(FunctionToolset([get_weather]))])


def test_pydantic_ai_runs_final_in_finishing(coord: Coordinator,
                                            provider: ProviderServer) -> None:
    async def scenario(root: ExecutionContext) -> None:
        client = budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k",
                                             max_retries=0))
        agent = pydantic_agent(client, FLAT)
        async with client:
            with pytest.raises(BudgetExceededError) as err:
                await run_agent(agent, "What is the weather in Paris?", context=root)
            assert err.value.reason == "final_reserve"
            with root.finishing():
                result = await run_agent(agent, "What is the weather in Paris?",
                                         context=root)
            assert result.output == "abcd" * 20

    with reserved_root() as root:
        asyncio.run(scenario(root))
        assert root.get_snapshot().status == "running"
    assert models_seen(provider) == [FLAT, FLAT]  # the refused request was never sent
    assert FINAL_CALLS == [True]
    check_tree(coord.client, root.chain_id)


def test_pydantic_ai_runs_on_the_rung_the_ladder_chose(coord: Coordinator,
                                                      provider: ProviderServer) -> None:
    async def scenario() -> str:
        client = budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k",
                                             max_retries=0))
        async with client:
            result = await run_agent(pydantic_agent(client, "gpt-4o"), "Weather in Paris?")
        return str(result.output)

    with ladder_root() as root:
        assert asyncio.run(scenario()) == "abcd" * 20
    assert models_seen(provider) == ["gpt-4o-mini", "gpt-4o-mini"]
    check_tree(coord.client, root.chain_id)


# -- the OpenAI Agents SDK ------------------------------------------------------------------

def test_openai_agents_run_final_in_finishing(coord: Coordinator,
                                             provider: ProviderServer) -> None:
    """The SDK runs its models and tools in tasks of its own, in agents' children of the
    root: ``finishing()`` around the run reaches them all."""
    async def scenario(root: ExecutionContext) -> str:
        client = budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k",
                                             max_retries=0))
        model = OpenAIChatCompletionsModel(model=FLAT, openai_client=client)
        settings = ModelSettings(max_tokens=1000)
        weather = Agent(name="weather", instructions="Answer about the weather.",
                        model=model, model_settings=settings,
                        tools=[function_tool(get_weather)])
        triage = Agent(name="triage", instructions="Hand weather questions off.",
                       model=model, model_settings=settings, handoffs=[weather])
        async with client:
            with pytest.raises(BudgetExceededError) as err:
                await run_agents(triage, "What is the weather in Paris?", context=root)
            assert err.value.reason == "final_reserve"
            with root.finishing():
                result = await run_agents(triage, "What is the weather in Paris?",
                                          context=root)
        return str(result.final_output)

    with reserved_root() as root:
        assert asyncio.run(scenario(root)) == "abcd" * 20
    assert models_seen(provider) == [FLAT] * 3  # triage, weather (tool), weather
    assert FINAL_CALLS == [True]
    check_tree(coord.client, root.chain_id)


# -- LangChain / LangGraph ------------------------------------------------------------------


@tool
def weather_tool(city: str) -> str:
    """The weather in a city."""
    return get_weather(city)




def test_a_langgraph_run_is_final_in_finishing(coord: Coordinator,
                                              provider: ProviderServer) -> None:
    """LangGraph runs its nodes on worker threads: ``finishing()`` reaches them."""
    llm = budgeted_chat_model(ChatOpenAI(model=FLAT, base_url=provider.openai_url,
                                         api_key="k", max_retries=0, max_tokens=1000))
    graph = weather_graph(llm, weather_tool)
    with reserved_root() as root:
        with pytest.raises(BudgetExceededError) as err:
            run_graph(graph, {"question": "Weather in Paris?"})
        assert err.value.reason == "final_reserve"
        with root.finishing():
            out = run_graph(graph, {"question": "Weather in Paris?"})
        assert out["answer"] == "abcd" * 20
    assert models_seen(provider) == [FLAT]
    check_tree(coord.client, root.chain_id)


def test_a_langgraph_model_runs_on_the_rung_the_ladder_chose(coord: Coordinator,
                                                            provider: ProviderServer) -> None:
    llm = budgeted_chat_model(ChatOpenAI(model="gpt-4o", base_url=provider.openai_url,
                                         api_key="k", max_retries=0, max_tokens=1000))
    with ladder_root() as root:
        out = run_graph(weather_graph(llm, weather_tool), {"question": "Weather in Paris?"})
        assert out["answer"] == "abcd" * 20
    assert models_seen(provider) == ["gpt-4o-mini"]
    check_tree(coord.client, root.chain_id)


def test_the_handler_refuses_a_chat_model_it_cannot_switch(coord: Coordinator,
                                                           provider: ProviderServer) -> None:
    """A chat model the handler budgets from its callbacks (no transport under its
    client): the ladder's choice cannot be applied, so the call is refused with DEGRADE
    naming the model to call, before anything is sent; the hold is given back. The model
    the ladder keeps runs."""
    handler = BudgetCallbackHandler(chat_models=True)
    moved = ChatOpenAI(model="gpt-4o", base_url=provider.openai_url, api_key="k",
                       max_retries=0, max_tokens=1000)
    with ladder_root() as root:
        with pytest.raises(BudgetExceededError) as err:
            moved.invoke("Weather in Paris?", config={"callbacks": [handler]})
        assert (err.value.decision, err.value.reason) == (Decision.DEGRADE, "degraded")
        assert "gpt-4o-mini" in err.value.detail
        assert models_seen(provider) == []
        kept = ChatOpenAI(model="gpt-4o", base_url=provider.openai_url, api_key="k",
                          max_retries=0, max_tokens=100)  # gpt-4o fits: no switch
        kept.invoke("Weather in Paris?", config={"callbacks": [handler]})
        assert models_seen(provider) == ["gpt-4o"]
        assert root.get_snapshot().status == "running"
    assert check_tree(coord.client, root.chain_id) > 0
