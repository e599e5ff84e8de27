"""The two-node LangGraph the integration tests run: a chat model node, then a tool node
asking the weather in Paris."""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    question: str
    answer: str
    weather: str


def weather_graph(llm: ChatOpenAI, weather: BaseTool) -> Any:
    """``think`` (``llm`` answers the question), then ``look`` (the ``weather`` tool),
    compiled as ``weather-graph``."""
    def think(state: State) -> dict[str, str]:
        return {"answer": str(llm.invoke(state["question"]).content)}

    def look(state: State, config: RunnableConfig) -> dict[str, str]:
        return {"weather": weather.invoke({"city": "Paris"}, config=config)}

    graph = StateGraph(State)
    graph.add_node("think", think)
    graph.add_node("look", look)
    graph.add_edge(START, "think")
    graph.add_edge("think", "look")
    graph.add_edge("look", END)
    return graph.compile(name="weather-graph")
