"""Bodies of the OS processes of the SDK transport tests (multiprocessing, spawn): OpenAI
clients given the transport, spending through one tree's token."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import openai

from coordinator import Coordinator, ExecutionContext
from coordinator.integrations import BudgetExceededError, budgeted
from tests.support.procs import TEST_KEYS

WORDS = "the quick brown fox jumps over the lazy dog".split()


def spend_through_openai(redis_url: str, token: str, base_url: str, seed: int,
                         out: Any) -> None:
    """Chat completions of random sizes until the tree refuses three in a row."""
    rng = random.Random(seed)
    coord = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    client = budgeted(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0),
                      context=ctx)
    allowed = refused = in_a_row = 0
    reasons: set[str] = set()
    while in_a_row < 3:
        limit = rng.choice([50, 100, 200]) if in_a_row == 0 else 50
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
        try:
            client.chat.completions.create(
                model="gpt-4", messages=[{"role": "user", "content": prompt}],
                max_tokens=limit, extra_headers={"x-fake-completion": str(
                    rng.randint(1, limit))})
        except BudgetExceededError as exc:
            refused += 1
            in_a_row += 1
            reasons.add(exc.reason)
            continue
        allowed += 1
        in_a_row = 0
    client.close()
    ctx.close()
    coord.close()
    out.put({"allowed": allowed, "refused": refused, "reasons": sorted(reasons)})


STORY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "tell me a story"}],
         "max_tokens": 1000, "stream": True,
         "extra_headers": {"x-fake-completion": "1000", "x-fake-delay-ms": "20"}}


def stream_until_aborted(redis_url: str, token: str, base_url: str, use_async: bool,
                         ready: Any, out: Any) -> None:
    """A slow stream (a chunk every 20 ms for 20 s), from an ``OpenAI`` or an
    ``AsyncOpenAI`` client; reports when and how it ended."""
    coord = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    heard: dict[str, float] = {}
    # when this process heard the abort (pub/sub), to time the transport's own part
    ctx.cancellation_token.on_cancel(lambda _r: heard.setdefault("at", time.time()))
    result: dict[str, Any] = {"seen": 0}

    def saw() -> None:
        result["seen"] += 1
        if result["seen"] == 3:
            ready.set()

    try:
        if use_async:
            async def consume() -> None:
                async with budgeted(openai.AsyncOpenAI(base_url=base_url, api_key="k",
                                                       max_retries=0), context=ctx) as aio:
                    async for _ in await aio.chat.completions.create(**STORY):
                        saw()

            asyncio.run(consume())
        else:
            with budgeted(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0),
                          context=ctx) as client:
                for _ in client.chat.completions.create(**STORY):
                    saw()
    except BudgetExceededError as exc:
        result.update(reason=exc.reason, decision=exc.decision.value)
    ended = time.time()
    snap = ctx.get_snapshot()
    node = snap.nodes[0] if snap.nodes else None
    out.put({**result, "ended": ended, "heard": heard.get("at", 0.0),
             "status": node.status if node else None,
             "output_tokens": node.output_tokens if node else None})
    ctx.close()
    coord.close()

