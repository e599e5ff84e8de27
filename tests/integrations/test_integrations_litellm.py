"""LiteLLM in-process over real HTTP to the local provider: ``completion`` runs
``litellm.completion`` as a wrapped call under a $0.05 root, charged what the provider's
usage costs, and is refused at the ceiling with the typed error before LiteLLM sends
anything; ``budgetctl tree`` shows the spend."""

from __future__ import annotations

import asyncio
import gc
import os
import warnings
from collections.abc import Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price fetch at import
from litellm.llms.custom_httpx.async_client_cleanup import (  # noqa: E402 - after the above
    close_litellm_async_clients,
)

from coordinator import Coordinator, ExecutionConfig, ExecutionContext  # noqa: E402
from coordinator.cli.tree import tree_text  # noqa: E402
from coordinator.core import pricing  # noqa: E402
from coordinator.core.amounts import usd_to_micro  # noqa: E402
from coordinator.integrations import BudgetExceededError  # noqa: E402
from coordinator.integrations.litellm import acompletion, completion  # noqa: E402
from tests.support.fake_provider import ProviderServer  # noqa: E402
from tests.support.invariants import check_tree  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
# LiteLLM's own models warn while pydantic builds them (not this package's code)
pytestmark = pytest.mark.filterwarnings("ignore:Item.*ReadOnly.*:UserWarning")


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture(autouse=True, scope="module")
def _litellm_leftovers() -> Iterator[None]:
    """LiteLLM leaves an event loop and sockets of its own unclosed: collect them here,
    quietly, rather than in whichever test runs when the collector next passes."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_litellm_completion_under_a_ceiling(coord: Coordinator,
                                           server: ProviderServer) -> None:
    args = {"model": "openai/gpt-4", "messages": MESSAGES, "api_base": server.openai_url,
            "api_key": "k", "max_tokens": 50}
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=100,
                                          max_retries_total=3)) as root:
        reply = completion(**args)
        assert reply.choices[0].message.content == "abcd" * 20
        calls = 1
        with pytest.raises(BudgetExceededError) as err:
            while True:
                completion(**args)
                calls += 1
        assert err.value.reason == "budget_exceeded"
        snap = root.get_snapshot()
    served = server.provider.stats()
    assert len(served) == calls  # the refused call never reached the provider
    used = check_tree(coord.client, root.chain_id)
    assert used == usd_to_micro(snap.cost_usd_accumulated) <= 50_000
    assert used == sum(usd_to_micro(pricing.price_usd("gpt-4", s["prompt_tokens"],
                                                      s["completion_tokens"]) or 0)
                       for s in served)
    assert f"{calls} calls" in tree_text(coord, root.chain_id)


def test_litellm_acompletion_is_budgeted(coord: Coordinator, server: ProviderServer) -> None:
    async def run() -> tuple[float, BaseException]:
        args = {"model": "openai/gpt-4", "messages": MESSAGES,
                "api_base": server.openai_url, "api_key": "k"}
        async with ExecutionContext(ExecutionConfig(max_cost_usd=0.01, max_steps=10,
                                                    max_retries_total=3)) as root:
            await acompletion(max_tokens=50, **args)
            with pytest.raises(BudgetExceededError) as err:
                await acompletion(max_tokens=1000, **args)  # $0.06 of output cannot fit
            spent = (await root.aget_snapshot()).cost_usd_accumulated
        await close_litellm_async_clients()
        return spent, err.value

    spent, _error = asyncio.run(run())
    served = server.provider.stats()
    assert len(served) == 1
    assert spent == pytest.approx(pricing.price_usd("gpt-4", served[0]["prompt_tokens"],
                                                    served[0]["completion_tokens"]))
