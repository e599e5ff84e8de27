"""What a caller's stream loop sees through ``budgeted(client)`` (the real openai and
anthropic SDKs, sync and async, over HTTP to tests/support/fake_provider.py): the provider's events
as they were sent, but for the usage-only chunk of a Chat Completions stream whose caller
did not ask for it (the transport asked): that chunk is metered and not handed on. Every
stream is charged the usage the provider stated, priced."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from operator import attrgetter
from typing import Any

import anthropic
import openai
import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.core import pricing
from coordinator.core.amounts import usd_to_micro
from coordinator.integrations import budgeted
from tests.support.fake_provider import ProviderServer

MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
CLAUDE = "claude-sonnet-4-6"
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat.completions", {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 9}),
    "responses": ("responses", {"model": "gpt-4o", "input": "Weather in Paris?",
                                "max_output_tokens": 9}),
    "messages": ("messages", {"model": CLAUDE, "messages": MESSAGES, "max_tokens": 9}),
}
"""Each API's streaming request: the SDK resource and its arguments (9 output tokens)."""
MODES = ["sync", "async"]


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture
def provider(server: ProviderServer) -> ProviderServer:
    server.provider.reset()
    return server


def root() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=3))


def client_for(api: str, mode: str, provider: ProviderServer, ctx: ExecutionContext) -> Any:
    if api == "messages":
        cls: Any = anthropic.Anthropic if mode == "sync" else anthropic.AsyncAnthropic
        return budgeted(cls(base_url=provider.url, api_key="k"), context=ctx)
    cls = openai.OpenAI if mode == "sync" else openai.AsyncOpenAI
    return budgeted(cls(base_url=provider.openai_url, api_key="k"), context=ctx)


def events(api: str, mode: str, provider: ProviderServer, ctx: ExecutionContext,
           **extra: Any) -> list[Any]:
    """What the caller's ``for event in stream`` loop is handed."""
    path, kw = REQUESTS[api]
    if mode == "sync":
        with client_for(api, mode, provider, ctx) as client:
            return list(attrgetter(path)(client).create(stream=True, **kw, **extra))

    async def run() -> list[Any]:
        async with client_for(api, mode, provider, ctx) as client:
            stream = await attrgetter(path)(client).create(stream=True, **kw, **extra)
            return [event async for event in stream]

    return asyncio.run(run())


def body_bytes(api: str, mode: str, provider: ProviderServer, ctx: ExecutionContext,
               **extra: Any) -> bytes:
    """The stream's body, as the SDK reads it from the transport."""
    path, kw = REQUESTS[api]
    if mode == "sync":
        with client_for(api, mode, provider, ctx) as client, attrgetter(path)(
                client).with_streaming_response.create(stream=True, **kw, **extra) as r:
            return b"".join(r.iter_bytes())

    async def run() -> bytes:
        async with client_for(api, mode, provider, ctx) as client, attrgetter(path)(
                client).with_streaming_response.create(stream=True, **kw, **extra) as r:
            return b"".join([chunk async for chunk in r.iter_bytes()])

    return asyncio.run(run())


def charged(ctx: ExecutionContext) -> int:
    return usd_to_micro(ctx.get_snapshot().cost_usd_accumulated)


def stated_cost(provider: ProviderServer) -> int:
    """The usage the provider stated for every request, priced."""
    total = 0
    for s in provider.provider.stats():
        cost = pricing.price_usd(s["model"], s["prompt_tokens"], s["completion_tokens"])
        assert cost is not None
        total += usd_to_micro(cost)
    return total


def sent_sha256(provider: ProviderServer, index: int) -> str:
    return str(provider.provider.stats()[index]["stream_sha256"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("options", [None, {"include_usage": False}])
def test_a_plain_chat_stream_loop_gets_no_usage_chunk_and_is_charged_its_usage(
        coord: Coordinator, provider: ProviderServer, mode: str,
        options: dict[str, bool] | None) -> None:
    extra = {} if options is None else {"stream_options": options}
    with root() as ctx:
        stream = events("chat", mode, provider, ctx, **extra)
        texts = [chunk.choices[0].delta.content for chunk in stream]  # the common loop
        assert texts == ["", *["abcd"] * 9, None]
        assert all(chunk.usage is None for chunk in stream)
        # the usage chunk was metered: the provider's stated prompt tokens (below the
        # transport's estimate) and its 9 output tokens, priced
        assert charged(ctx) == stated_cost(provider) > 0
        assert ctx.get_snapshot().nodes[0].output_tokens == 9


@pytest.mark.parametrize("mode", MODES)
def test_a_caller_that_asks_for_the_usage_chunk_receives_it(
        coord: Coordinator, provider: ProviderServer, mode: str) -> None:
    asked = {"stream_options": {"include_usage": True}}
    with root() as ctx:
        stream = events("chat", mode, provider, ctx, **asked)
        assert stream[-1].choices == [] and stream[-1].usage is not None
        assert stream[-1].usage.completion_tokens == 9
        raw = body_bytes("chat", mode, provider, ctx, **asked)
        assert hashlib.sha256(raw).hexdigest() == sent_sha256(provider, 1)
        assert charged(ctx) == stated_cost(provider) > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_responses_and_anthropic_streams_reach_the_caller_as_sent(
        coord: Coordinator, provider: ProviderServer, api: str, mode: str) -> None:
    """The transport adds nothing to these requests: the caller reads the provider's
    bytes, every event in order, and the stream is charged the usage they state."""
    with root() as ctx:
        raw = body_bytes(api, mode, provider, ctx)
        assert hashlib.sha256(raw).hexdigest() == sent_sha256(provider, 0)
        stream = events(api, mode, provider, ctx)
        if api == "responses":
            texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
            assert [e.sequence_number for e in stream] == list(range(11))
            assert stream[-1].type == "response.completed"
        else:
            texts = [e.delta.text for e in stream if e.type == "content_block_delta"]
            assert [e.type for e in stream][-2:] == ["message_delta", "message_stop"]
        assert texts == ["abcd"] * 9
        assert charged(ctx) == stated_cost(provider) > 0
