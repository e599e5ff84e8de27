"""LangChain and LangGraph over real HTTP to the local provider: a two-node graph (a
ChatOpenAI node with the transport under its client, then a tool node) runs as a child
context named after the graph, its tool run a wrapped tool call through the callback
handler; it is refused at a $0.05 ceiling with the typed error, and its spend and tree
show in ``budgetctl tree``. Chat models whose client the transport does not cover are
budgeted by the handler from their callbacks."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, current_context
from coordinator.cli.tree import tree_text
from coordinator.core import pricing
from coordinator.core.amounts import usd_to_micro
from coordinator.integrations import BudgetExceededError
from coordinator.integrations.langchain import (
    BudgetCallbackHandler,
    budgeted_chat_model,
    run_graph,
)
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree
from tests.support.langgraph_weather import weather_graph

GRAPH_CONTEXTS: list[str] = []


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()



@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    ctx = current_context()
    assert ctx is not None
    GRAPH_CONTEXTS.append(ctx.chain_id)
    return f"sunny in {city}"




def test_a_two_node_graph_runs_under_a_ceiling(coord: Coordinator,
                                               server: ProviderServer) -> None:
    llm = budgeted_chat_model(ChatOpenAI(model="gpt-4", base_url=server.openai_url,
                                         api_key="k", max_retries=0, max_tokens=50))
    graph = weather_graph(llm, get_weather)
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=1000,
                                          max_retries_total=5)) as root:
        out = graph_run = run_graph(graph, {"question": "Weather in Paris?"})
        assert (out["answer"], out["weather"]) == ("abcd" * 20, "sunny in Paris")
        runs = 1
        with pytest.raises(BudgetExceededError) as err:
            while True:
                graph_run = run_graph(graph, {"question": "And in Lisbon?"})
                runs += 1
        assert graph_run is not None
        assert err.value.reason == "budget_exceeded"
        assert isinstance(err.value, openai.OpenAIError)  # the transport refused the model
        snap = root.get_snapshot()
    used = check_tree(coord.client, root.chain_id)
    assert used == usd_to_micro(snap.cost_usd_accumulated) <= 50_000
    served = server.provider.stats()
    assert used == sum(usd_to_micro(pricing.price_usd(s["model"], s["prompt_tokens"],
                                                      s["completion_tokens"]) or 0)
                       for s in served)
    assert tree_text(coord, root.chain_id).count("weather-graph") == runs + 1
    first = ExecutionContext.load_snapshot(GRAPH_CONTEXTS[0])
    assert first.parent_chain_id == root.chain_id
    assert sorted((n.kind, n.operation_name) for n in first.nodes) == [
        ("llm", "chat gpt-4"), ("tool", "tool get_weather")]


def test_the_handler_budgets_chat_models_the_transport_does_not_cover(
        coord: Coordinator, server: ProviderServer) -> None:
    llm = ChatOpenAI(model="gpt-4", base_url=server.openai_url, api_key="k",
                     max_retries=0, max_tokens=50)  # no transport under this one
    handler = BudgetCallbackHandler(chat_models=True)
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.01, max_steps=100,
                                          max_retries_total=5)) as root:
        llm.invoke("Weather in Paris?", config={"callbacks": [handler]})
        served = server.provider.stats()[0]
        expected = pricing.price_usd("gpt-4", served["prompt_tokens"],
                                     served["completion_tokens"])
        assert root.get_snapshot().cost_usd_accumulated == pytest.approx(expected)
        longer = ChatOpenAI(model="gpt-4", base_url=server.openai_url, api_key="k",
                            max_retries=0, max_tokens=1000)
        with pytest.raises(BudgetExceededError):
            # 50 output tokens of gpt-4 fit; 1,000 do not: refused before it was sent
            longer.invoke("Weather?", config={"callbacks": [handler]})
        assert len(server.provider.stats()) == 1
        unbounded = ChatOpenAI(model="gpt-4", base_url=server.openai_url, api_key="k",
                               max_retries=0)  # gpt-4's documented cap would not fit
        # a limit bound to the model reaches the reservation (invocation_params)
        unbounded.bind(max_tokens=50).invoke("Weather?", config={"callbacks": [handler]})
        assert len(server.provider.stats()) == 2
