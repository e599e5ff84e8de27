"""``budgeted(client)``: the official OpenAI and Anthropic SDKs (sync and async) over
real HTTP to a local provider (tests/support/fake_provider.py). Each request is reserved from its
body and refused before it is sent when it cannot fit, settled from the response's usage
(streams as their events arrive, cut at what the call holds), and provider errors count
under the retry rules, every SDK retry a call of its own."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Iterator

import anthropic
import openai
import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.core import pricing
from coordinator.core.amounts import usd_to_micro
from coordinator.integrations import BudgetExceededError, TransportSettings, budgeted
from coordinator.integrations.request_plan import estimate_input_tokens
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree

MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
CLAUDE = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture
def provider(server: ProviderServer) -> Iterator[ProviderServer]:
    server.provider.reset()
    yield server
    for client in OPENED:  # their pooled connections
        client.close()
    OPENED.clear()


OPENED: list[openai.OpenAI | anthropic.Anthropic] = []


def oai(provider: ProviderServer, **kw: object) -> openai.OpenAI:
    client = openai.OpenAI(base_url=provider.openai_url, api_key="k", **kw)  # type: ignore[arg-type]
    OPENED.append(client)
    return client


def claude(provider: ProviderServer, **kw: object) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=provider.url, api_key="k", **kw)  # type: ignore[arg-type]
    OPENED.append(client)
    return client


def root(usd: float = 1.0, retries: int = 10) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=1000,
                                            max_retries_total=retries))


def micro(model: str, tin: int, tout: int) -> int:
    cost = pricing.price_usd(model, tin, tout)
    assert cost is not None
    return usd_to_micro(cost)


def charged(ctx: ExecutionContext) -> int:
    return usd_to_micro(ctx.get_snapshot().cost_usd_accumulated)


def server_cost(provider: ProviderServer) -> int:
    return sum(micro(s["model"], s["prompt_tokens"], s["completion_tokens"])
               for s in provider.provider.stats() if s["status"] == 200)


def test_openai_chat_is_charged_the_response_usage(coord: Coordinator,
                                                   provider: ProviderServer) -> None:
    client = budgeted(oai(provider))
    with root() as ctx:
        reply = client.chat.completions.create(model="gpt-4o", messages=MESSAGES,
                                               max_tokens=40)
        assert reply.usage is not None and reply.usage.completion_tokens == 20
        snap = ctx.get_snapshot()
        assert charged(ctx) == server_cost(provider) == micro("gpt-4o", reply.usage.prompt_tokens,
                                                              20)
        node = snap.nodes[0]
        assert (node.status, node.input_tokens, node.output_tokens) == (
            "ok", reply.usage.prompt_tokens, 20)
        assert snap.cost_usd_reserved == 0
    check_tree(coord.client, ctx.chain_id)


def test_outside_a_context_requests_pass_unbudgeted(coord: Coordinator,
                                                    provider: ProviderServer) -> None:
    client = budgeted(oai(provider))
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
    assert len(provider.provider.stats()) == 1
    strict = budgeted(oai(provider),
                      settings=TransportSettings(require_context=True))
    with pytest.raises(BudgetExceededError) as err:
        strict.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
    assert err.value.reason == "no_context"
    assert len(provider.provider.stats()) == 1


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_refused_before_a_byte_is_sent_and_never_retried(coord: Coordinator,
                                                         provider: ProviderServer,
                                                         sdk: str) -> None:
    with root(usd=0.01) as ctx:
        if sdk == "openai":
            client = budgeted(oai(provider, max_retries=3), context=ctx)
            with pytest.raises(openai.OpenAIError) as err:
                # no max_tokens: gpt-4o's documented 16,384-token cap is held (~$0.16)
                client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        else:
            client = budgeted(claude(provider, max_retries=3), context=ctx)
            with pytest.raises(anthropic.AnthropicError) as err:
                client.messages.create(model=CLAUDE, max_tokens=4000, messages=MESSAGES)
        error = err.value
        assert isinstance(error, BudgetExceededError)
        assert not isinstance(error, (openai.APIConnectionError, anthropic.APIConnectionError))
        assert error.reason == "budget_exceeded" and error.decision.value == "HALT"
        assert error.snapshot is not None and error.snapshot.chain_id == ctx.chain_id
        assert provider.provider.stats() == []  # nothing reached the provider
        assert charged(ctx) == 0
        copy = pickle.loads(pickle.dumps(error))  # e.g. a task's error, sent back
        assert type(copy) is type(error) and copy.reason == error.reason


def test_a_request_without_a_limit_holds_the_default_output_setting(
        coord: Coordinator, provider: ProviderServer) -> None:
    with root(usd=0.01) as ctx:
        client = budgeted(oai(provider),
                          context=ctx, default_output_tokens=100)
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert charged(ctx) == server_cost(provider) > 0


def test_anthropic_messages_sync_and_stream(coord: Coordinator,
                                            provider: ProviderServer) -> None:
    client = budgeted(claude(provider))
    with root() as ctx:
        message = client.messages.create(model=CLAUDE, max_tokens=30, messages=MESSAGES)
        assert message.usage.output_tokens == 20
        with client.messages.stream(model=CLAUDE, max_tokens=30, messages=MESSAGES) as s:
            assert "".join(s.text_stream) == "abcd" * 20
        assert charged(ctx) == server_cost(provider)
        assert [n.output_tokens for n in ctx.get_snapshot().nodes] == [20, 20]


def test_responses_and_embeddings_are_budgeted(coord: Coordinator,
                                               provider: ProviderServer) -> None:
    pricing.set_price("text-embedding-3-small", input_per_mtok=0.02, output_per_mtok=0.0)
    try:
        client = budgeted(oai(provider))
        with root() as ctx:
            r = client.responses.create(model="gpt-4o", input="Weather in Paris?",
                                        max_output_tokens=30)
            assert r.usage is not None and r.usage.output_tokens == 20
            events = list(client.responses.create(model="gpt-4o", input="Weather?",
                                                  max_output_tokens=30, stream=True))
            assert events[-1].type == "response.completed"
            client.embeddings.create(model="text-embedding-3-small", input="Paris")
            assert charged(ctx) == server_cost(provider)
            assert len(ctx.get_snapshot().nodes) == 3
    finally:
        pricing.clear_prices()


def test_async_clients(coord: Coordinator, provider: ProviderServer) -> None:
    async def run() -> None:
        oa = budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k"))
        an = budgeted(anthropic.AsyncAnthropic(base_url=provider.url, api_key="k"))
        async with oa, an, root() as ctx:
            await oa.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=9)
            stream = await oa.chat.completions.create(model="gpt-4o", messages=MESSAGES,
                                                      max_tokens=9, stream=True)
            # role, 9 texts, stop (the usage chunk the transport asked for is not shown)
            assert len([c async for c in stream]) == 11
            await an.messages.create(model=CLAUDE, max_tokens=9, messages=MESSAGES)
            async with an.messages.stream(model=CLAUDE, max_tokens=9,
                                          messages=MESSAGES) as s:
                assert "".join([t async for t in s.text_stream]) == "abcd" * 9
            snap = await ctx.aget_snapshot()
            assert usd_to_micro(snap.cost_usd_accumulated) == server_cost(provider)
            assert len(snap.nodes) == 4
            small = ctx.spawn_child(max_cost_usd=0.0001)
            with pytest.raises(anthropic.AnthropicError) as err:
                await budgeted(an, context=small).messages.create(
                    model=CLAUDE, max_tokens=1000, messages=MESSAGES)
            assert isinstance(err.value, BudgetExceededError)
            assert len(provider.provider.stats()) == 4
            await small.aclose()

    asyncio.run(run())


def test_a_stream_that_would_pass_the_ceiling_is_cut(coord: Coordinator,
                                                     provider: ProviderServer) -> None:
    """No max_tokens, 10 output tokens reserved: the provider would send 50, the stream is
    cut after the 10th (the chunk that reached it is the last one handed on) and charged
    the input estimate plus the 10 tokens its chunks carried."""
    client = budgeted(oai(provider),
                      default_output_tokens=10)
    with root() as ctx:
        stream = client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True,
            extra_headers={"x-fake-completion": "50", "x-fake-delay-ms": "5"})
        texts = [c.choices[0].delta.content for c in stream if c.choices]
        assert texts == ["", *["abcd"] * 10]
        body = {"messages": MESSAGES}
        assert charged(ctx) == micro("gpt-4o", estimate_input_tokens(body), 10)
        node = ctx.get_snapshot().nodes[0]
        assert (node.status, node.output_tokens) == ("ok", 10)
    deadline = time.monotonic() + 5
    while not provider.provider.stats()[0]["disconnected"]:  # the provider saw it go
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert provider.provider.stats()[0]["chunks_sent"] < 30


def test_anthropic_stream_cut_is_charged_its_stated_input(coord: Coordinator,
                                                          provider: ProviderServer) -> None:
    client = budgeted(claude(provider),
                      default_output_tokens=8)
    with root() as ctx:
        # max_tokens is named: the provider is trusted to enforce it, and a stream going
        # past it anyway is cut at the first chunk over
        with client.messages.stream(model=CLAUDE, max_tokens=8, messages=MESSAGES,
                                    extra_headers={"x-fake-completion": "30"}) as s:
            text = "".join(s.text_stream)
        assert text == "abcd" * 9  # one chunk past the named limit, then cut
        stated_input = provider.provider.stats()[0]["prompt_tokens"]
        assert charged(ctx) == micro(CLAUDE, stated_input, 9)


def test_provider_errors_count_as_failed_calls_each_sdk_retry_a_call(
        coord: Coordinator, provider: ProviderServer) -> None:
    client = budgeted(oai(provider, max_retries=2))
    with root(retries=10) as ctx:
        client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, max_tokens=5,
            extra_headers={"x-fake-key": "flaky", "x-fake-fail-first": "2"})
        snap = ctx.get_snapshot()
        assert [n.status for n in snap.nodes] == ["error", "error", "ok"]
        assert snap.retries_used == 2
        assert [s["retry_count"] for s in provider.provider.stats()] == ["0", "1", "2"]
        with pytest.raises(openai.RateLimitError):
            client.with_options(max_retries=0).chat.completions.create(
                model="gpt-4o", messages=MESSAGES, max_tokens=5,
                extra_headers={"x-fake-status": "429"})
        assert ctx.get_snapshot().retries_used == 3
        assert charged(ctx) == server_cost(provider)


def test_spent_retry_budget_stops_the_sdk_retrying(coord: Coordinator,
                                                   provider: ProviderServer) -> None:
    client = budgeted(claude(provider, max_retries=5))
    with root(retries=2) as ctx:
        with pytest.raises(BudgetExceededError) as err:
            client.messages.create(model=CLAUDE, max_tokens=5, messages=MESSAGES,
                                   extra_headers={"x-fake-status": "500"})
        assert err.value.reason == "provider_error"
        # the first 500 counted one retry, the second spent the budget: no third request
        assert len(provider.provider.stats()) == 2
        assert ctx.get_snapshot().retries_used == 2


def test_timeouts_are_failed_calls_and_each_sdk_retry_a_call(coord: Coordinator,
                                                            provider: ProviderServer) -> None:
    client = budgeted(oai(provider, max_retries=1, timeout=0.3))
    with root(retries=10) as ctx:
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5,
                                           extra_headers={"x-fake-wait-ms": "2000"})
        snap = ctx.get_snapshot()
        assert [n.status for n in snap.nodes] == ["error", "error"]
        assert snap.retries_used == 2 and snap.cost_usd_reserved == 0


def test_an_abort_cancels_a_sync_request_waiting_for_its_headers(
        coord: Coordinator, provider: ProviderServer) -> None:
    client = budgeted(oai(provider, max_retries=2))
    with root() as ctx:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
        timer = threading.Timer(0.3, ctx.abort, args=("operator pressed stop",))
        timer.start()  # the second request reuses the first one's pooled connection
        started = time.monotonic()
        with pytest.raises(BudgetExceededError) as err:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5,
                                           extra_headers={"x-fake-wait-ms": "5000"})
        took = time.monotonic() - started
        timer.join()
    assert err.value.reason == "aborted" and took < 2  # not the provider's 5 s
    assert len(provider.provider.stats()) == 1  # the first; no SDK retry of the second
    assert [n.status for n in ctx.get_snapshot().nodes] == ["ok", "aborted"]


def test_an_abort_cancels_an_async_request_waiting_for_its_headers(
        coord: Coordinator, provider: ProviderServer) -> None:
    async def run() -> tuple[float, BudgetExceededError]:
        async with budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k",
                                               max_retries=2)) as client, root() as ctx:
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, lambda: threading.Thread(
                target=ctx.abort, args=("operator pressed stop",)).start())
            started = time.monotonic()
            with pytest.raises(BudgetExceededError) as err:
                await client.chat.completions.create(
                    model="gpt-4o", messages=MESSAGES, max_tokens=5,
                    extra_headers={"x-fake-wait-ms": "5000"})
            return time.monotonic() - started, err.value

    took, error = asyncio.run(run())
    assert error.reason == "aborted" and took < 2  # not the provider's 5 s
    assert len(provider.provider.stats()) == 0  # cancelled before it was answered
