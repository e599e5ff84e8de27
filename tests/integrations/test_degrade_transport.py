"""Model ladders and the final reserve (issue 31, docs/degrade.md) through the SDK
transport, LiteLLM's wrapper and proxy, and a hand-wrapped call, over real HTTP to the
local provider (tests/support/fake_provider.py): a request is sent on the model its ladder
chose (the provider sees that model) and charged what the provider's usage costs at it;
an ordinary request is refused at the final reserve with ``final_reserve`` while the
context runs on, and requests in ``ctx.finishing()`` spend the reserve and no more."""

from __future__ import annotations

import asyncio
import gc
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price fetch at import
from coordinator import (  # noqa: E402 - after the above
    Coordinator,
    Degrade,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from coordinator.context.execution import current_call  # noqa: E402
from coordinator.core import pricing  # noqa: E402
from coordinator.core.amounts import usd_to_micro  # noqa: E402
from coordinator.integrations import BudgetExceededError, budgeted  # noqa: E402
from coordinator.models import Decision  # noqa: E402
from tests.support.fake_provider import ProviderServer  # noqa: E402
from tests.support.invariants import check_tree  # noqa: E402
from tests.support.litellm_proxy import MASTER_KEY, litellm_proxy  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
LADDER = {"gpt-4o": ["gpt-4o-mini"]}
OUT = 4700
"""Output tokens asked and produced: a gpt-4o call costs about $0.047, gpt-4o-mini $0.0028
(under a $0.10 ceiling: two on gpt-4o, then two on gpt-4o-mini; few streamed chunks)."""
FLAT = "flat-test-model"
"""A model priced $10 per million output tokens and nothing for input: 1,000 output
tokens cost exactly $0.01, worst case and actual alike."""
# LiteLLM's own models warn while pydantic builds them (not this package's code)
pytestmark = pytest.mark.filterwarnings("ignore:Item.*ReadOnly.*:UserWarning")


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture
def provider(server: ProviderServer) -> Iterator[ProviderServer]:
    server.provider.reset()
    yield server


def ladder_root(usd: float = 0.10, *, below: float = 0.5, reserve: float = 0.0,
                ladder: dict[str, list[str]] | None = None) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(
        max_cost_usd=usd, max_steps=1000, max_retries_total=10, final_reserve_usd=reserve,
        degrade=Degrade(ladder=ladder or LADDER, below=below)))


def micro(model: str, tin: int, tout: int) -> int:
    cost = pricing.price_usd(model, tin, tout)
    assert cost is not None, model
    return usd_to_micro(cost)


def served(provider: ProviderServer) -> list[dict[str, Any]]:
    return [s for s in provider.provider.stats() if s["status"] == 200]


def cost_of(s: dict[str, Any]) -> int:
    return micro(s["model"], s["prompt_tokens"], s["completion_tokens"])


def degraded_events(ctx: ExecutionContext) -> list[Any]:
    return [e for e in ctx.get_snapshot().events if e.event_type == "degraded"]


def check_ladder_run(coord: Coordinator, ctx: ExecutionContext, provider: ProviderServer,
                     replies: list[str], ceiling: int, below: float) -> None:
    """The provider saw gpt-4o while at least ``below`` of the ceiling remained before
    the request, then gpt-4o-mini only; each reply came from the model the provider ran;
    the books are the provider's usage priced at the model that ran."""
    seen = served(provider)
    models = [s["model"] for s in seen]
    assert models == replies
    spent, expected = 0, []
    for s in seen:
        expected.append("gpt-4o" if ceiling - spent >= below * ceiling else "gpt-4o-mini")
        spent += cost_of(s)
    assert models == expected
    assert "gpt-4o" in models and "gpt-4o-mini" in models
    snap = ctx.get_snapshot()
    nodes = [n for n in snap.nodes if n.status == "ok"]
    assert [(n.model, n.degraded_from) for n in nodes] == [
        (m, None if m == "gpt-4o" else "gpt-4o") for m in models]
    assert usd_to_micro(snap.cost_usd_accumulated) == spent
    assert check_tree(coord.client, ctx.chain_id) == spent <= ceiling
    events = degraded_events(ctx)
    assert len(events) == 1, events


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_ladder_degrades_requests_below_half(coord: Coordinator, provider: ProviderServer,
                                               stream: bool) -> None:
    client = budgeted(openai.OpenAI(base_url=provider.openai_url, api_key="k"))
    replies: list[str] = []
    with ladder_root() as ctx, client:
        with pytest.raises(BudgetExceededError) as err:
            for _ in range(100):
                args: dict[str, Any] = {
                    "model": "gpt-4o", "messages": MESSAGES, "max_tokens": OUT,
                    "extra_headers": {"x-fake-completion": str(OUT)}}
                if stream:
                    chunks = list(client.chat.completions.create(**args, stream=True))
                    assert "".join(c.choices[0].delta.content or "" for c in chunks
                                   if c.choices) == "abcd" * OUT
                    replies.append(chunks[0].model)
                else:
                    replies.append(client.chat.completions.create(**args).model)
        assert err.value.reason == "budget_exceeded"
    check_ladder_run(coord, ctx, provider, replies, 100_000, 0.5)


def test_the_async_transport_degrades_a_stream(coord: Coordinator,
                                               provider: ProviderServer) -> None:
    async def run() -> list[str]:
        replies: list[str] = []
        client = budgeted(openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k"))
        async with client:
            with pytest.raises(BudgetExceededError):
                for _ in range(100):
                    stream = await client.chat.completions.create(
                        model="gpt-4o", messages=MESSAGES, max_tokens=OUT, stream=True,
                        extra_headers={"x-fake-completion": str(OUT)})
                    replies.append([c.model async for c in stream][0])
        return replies

    with ladder_root() as ctx:
        replies = asyncio.run(run())
    check_ladder_run(coord, ctx, provider, replies, 100_000, 0.5)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_request_whose_worst_case_fits_only_on_the_cheaper_model(
        coord: Coordinator, provider: ProviderServer, sdk: str) -> None:
    """$0.01 left: gpt-4o's worst case ($0.047) does not fit, gpt-4o-mini's does: the
    request is served by gpt-4o-mini, not refused (while all of the ceiling remains)."""
    ladder = {"gpt-4o": ["gpt-4o-mini"], "claude-opus-4-7": ["claude-sonnet-4-6"]}
    with ladder_root(0.01, below=0.2, ladder=ladder) as ctx:
        if sdk == "openai":
            with budgeted(openai.OpenAI(base_url=provider.openai_url, api_key="k")) as oa:
                reply = oa.chat.completions.create(model="gpt-4o", messages=MESSAGES,
                                                   max_tokens=OUT)
            ran, asked = reply.model, "gpt-4o"
        else:
            with budgeted(anthropic.Anthropic(base_url=provider.url, api_key="k")) as an:
                # opus: $0.0125 of output at worst; sonnet $0.0075
                message = an.messages.create(model="claude-opus-4-7", max_tokens=500,
                                             messages=MESSAGES)
            ran, asked = message.model, "claude-opus-4-7"
        (seen,) = served(provider)
        assert ran == seen["model"] == ladder[asked][0]
        (node,) = ctx.get_snapshot().nodes
        assert (node.model, node.degraded_from) == (ran, asked)
    assert check_tree(coord.client, ctx.chain_id) == cost_of(seen)
    assert len(degraded_events(ctx)) == 1


@pytest.fixture
def flat_price() -> Iterator[None]:
    pricing.set_price(FLAT, input_per_mtok=0.0, output_per_mtok=10.0)
    yield
    pricing.clear_prices()


def test_the_final_reserve_through_the_transport(coord: Coordinator, provider: ProviderServer,
                                                 flat_price: None) -> None:
    """$0.10 with a $0.03 final reserve, $0.01 requests: ordinary ones stop at $0.07 with
    ``final_reserve`` (a child's too), the context running on; in ``ctx.finishing()``
    (a stream among them) they spend the reserve and no more."""
    client = budgeted(openai.OpenAI(base_url=provider.openai_url, api_key="k"))
    args: dict[str, Any] = {"model": FLAT, "messages": MESSAGES, "max_tokens": 1000,
                            "extra_headers": {"x-fake-completion": "1000"}}
    config = ExecutionConfig(max_cost_usd=0.10, max_steps=1000, max_retries_total=10,
                             final_reserve_usd=0.03)
    with ExecutionContext(config) as ctx, client:
        ordinary = 0
        with pytest.raises(BudgetExceededError) as err:
            for _ in range(20):
                client.chat.completions.create(**args)
                ordinary += 1
        assert (err.value.decision, err.value.reason) == (Decision.HALT, "final_reserve")
        assert err.value.snapshot is not None
        assert err.value.snapshot.cost_usd_accumulated == pytest.approx(0.07)
        assert ordinary == 7
        child = ctx.spawn_child()
        with pytest.raises(BudgetExceededError) as child_err:
            budgeted(client, context=child).chat.completions.create(**args)
        assert child_err.value.reason == "final_reserve"
        child.close()
        budgeted(client)  # the current context again
        snap = ctx.get_snapshot()
        assert snap.status == "running" and ctx.stop_reason is None
        assert usd_to_micro(snap.cost_usd_accumulated) == 70_000

        final = 0
        with ctx.finishing():
            with pytest.raises(BudgetExceededError) as last:
                for _ in range(10):
                    if final == 1:
                        list(client.chat.completions.create(**args, stream=True))
                    else:
                        client.chat.completions.create(**args)
                    final += 1
        assert final == 3 and last.value.reason != "final_reserve"
        assert usd_to_micro(ctx.get_snapshot().cost_usd_accumulated) == 100_000
    assert len(served(provider)) == 10
    assert check_tree(coord.client, ctx.chain_id) == 100_000


def test_finishing_reaches_the_async_transport(coord: Coordinator, provider: ProviderServer,
                                               flat_price: None) -> None:
    """``ctx.finishing()`` entered around an async run reaches the requests of the tasks
    it starts."""
    config = ExecutionConfig(max_cost_usd=0.03, max_steps=1000, max_retries_total=10,
                             final_reserve_usd=0.02)

    async def ask(client: openai.AsyncOpenAI) -> None:
        await client.chat.completions.create(
            model=FLAT, messages=MESSAGES, max_tokens=1000,
            extra_headers={"x-fake-completion": "1000"})

    async def run(ctx: ExecutionContext) -> list[BaseException | None]:
        async with budgeted(openai.AsyncOpenAI(base_url=provider.openai_url,
                                               api_key="k")) as client:
            await ask(client)  # $0.01: what the reserve leaves to ordinary calls
            with pytest.raises(BudgetExceededError) as err:
                await ask(client)
            assert err.value.reason == "final_reserve"
            with ctx.finishing():
                results = await asyncio.gather(ask(client), ask(client),
                                               return_exceptions=True)
            return list(results)

    with ExecutionContext(config) as ctx:
        assert asyncio.run(run(ctx)) == [None, None]
    assert check_tree(coord.client, ctx.chain_id) == 30_000


def test_a_hand_wrapped_call_reads_the_model_it_runs_on(coord: Coordinator,
                                                       provider: ProviderServer) -> None:
    """``current_call().model`` is the ladder's choice; the function sends it, and the
    call is charged the response's usage at that model."""
    plain = openai.OpenAI(base_url=provider.openai_url, api_key="k")  # not budgeted
    options = WrapOptions(provider="openai", model="gpt-4o", input_tokens_estimate=100,
                          max_output_tokens=OUT)
    seen: list[Any] = []

    def call() -> Any:
        info = current_call()
        assert info is not None
        seen.append(info)
        return plain.chat.completions.create(model=info.model or "", messages=MESSAGES,
                                             max_tokens=OUT)

    with plain, ladder_root(0.01, below=0.2) as ctx:
        replies: list[Any] = []
        assert ctx.wrap_llm_call(lambda: replies.append(call()) or replies[-1],
                                 options) == Decision.ALLOW
        assert replies[0].model == "gpt-4o-mini"
        (info,) = seen
        assert (info.model, info.requested_model, info.degraded, info.final) == (
            "gpt-4o-mini", "gpt-4o", True, False)
        (s,) = served(provider)
        assert s["model"] == "gpt-4o-mini"
    assert check_tree(coord.client, ctx.chain_id) == cost_of(s)


# -- LiteLLM ------------------------------------------------------------------------------

@pytest.fixture
def litellm_leftovers() -> Iterator[None]:
    """LiteLLM leaves an event loop and sockets of its own unclosed: collected here."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_litellm_completion_runs_on_the_chosen_model(coord: Coordinator,
                                                    provider: ProviderServer,
                                                    litellm_leftovers: None) -> None:
    from coordinator.integrations.litellm import acompletion, completion

    ladder = {"openai/gpt-4o": ["openai/gpt-4o-mini"]}
    args = {"model": "openai/gpt-4o", "messages": MESSAGES, "api_base": provider.openai_url,
            "api_key": "k", "max_tokens": OUT}
    with ladder_root(0.01, below=0.2, ladder=ladder) as ctx:
        reply = completion(**args)
        areply = asyncio.run(acompletion(**args))
        seen = served(provider)
        assert [s["model"] for s in seen] == ["gpt-4o-mini"] * 2
        assert "gpt-4o-mini" in reply.model and "gpt-4o-mini" in areply.model
        nodes = ctx.get_snapshot().nodes
        assert [n.degraded_from for n in nodes] == ["openai/gpt-4o"] * 2
    assert check_tree(coord.client, ctx.chain_id) == sum(cost_of(s) for s in seen)


PROXY_CONFIG = "".join(f"""
  - model_name: {name}
    litellm_params:
      model: openai/{name}
      api_base: os.environ/OPENAI_BASE_URL
      api_key: os.environ/OPENAI_API_KEY""" for name in ("gpt-4o", "gpt-4o-mini"))
PROXY_CONFIG = f"""model_list:{PROXY_CONFIG}
litellm_settings:
  callbacks: coordinator.integrations.litellm_proxy.budget_hook
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
"""


def test_the_litellm_proxy_routes_the_chosen_model(coord: Coordinator,
                                                  provider: ProviderServer, redis_url: str,
                                                  tmp_path: Path) -> None:
    """The proxy's hook renames a request's model to the ladder's choice before the
    proxy routes it (a stream too); each is charged at the model that ran."""
    with litellm_proxy(PROXY_CONFIG, provider, redis_url, tmp_path) as url, \
            openai.OpenAI(base_url=url, api_key=MASTER_KEY, max_retries=0) as client, \
            ladder_root(0.01, below=0.2) as ctx:
        args: dict[str, Any] = {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": OUT,
                                "extra_headers": {"budget-context": ctx.token}}
        # (the proxy answers under the model name it was asked for)
        client.chat.completions.create(**args)
        chunks = list(client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices) == "abcd" * 20
        coord.store.flush()
        seen = served(provider)
        assert [s["model"] for s in seen] == ["gpt-4o-mini"] * 2
        nodes = ctx.get_snapshot().nodes
        assert [(n.model, n.degraded_from) for n in nodes] == [("gpt-4o-mini", "gpt-4o")] * 2
    assert check_tree(coord.client, ctx.chain_id) == sum(cost_of(s) for s in seen)


def test_a_degraded_call_reporting_nothing_is_charged_its_rungs_worst_case(
        coord: Coordinator) -> None:
    """The estimate a call reporting nothing is charged is the worst case of the model
    that ran (what its reserve held), not the hint priced at the model asked for."""
    options = WrapOptions(provider="openai", model="gpt-4o", input_tokens_estimate=100,
                          max_output_tokens=OUT, cost_estimate_hint=0.047)
    with ladder_root(0.01, below=0.2) as ctx:
        assert ctx.wrap_llm_call(lambda: None, options) == Decision.ALLOW
        (node,) = ctx.get_snapshot().nodes
        assert (node.model, node.degraded_from, node.charged_by) == (
            "gpt-4o-mini", "gpt-4o", "estimate")
    held = micro("gpt-4o-mini", 100, OUT)
    assert check_tree(coord.client, ctx.chain_id) == usd_to_micro(node.cost_usd)
    assert abs(usd_to_micro(node.cost_usd) - held) <= 1  # (the hold rounds up)
