"""Bodies of the OS processes that the distributed tests start (multiprocessing, spawn)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from coordinator import (
    Coordinator,
    Decision,
    ExecutionContext,
    WrapOptions,
    current_cancellation_token,
    report_usage,
)

TEST_KEYS = {"test": b"test-secret-0123456789abcdef"}


def _coord(url: str, **kw: Any) -> Coordinator:
    return Coordinator.from_url(url, token_keys=TEST_KEYS, **kw)


def hammer(url: str, token: str, seed: int, max_calls: int, out: Any) -> None:
    """Spend through an attached context until the tree halts it. Estimates are >= the
    actual spend, so no ceiling may be crossed. Some calls fail after spending."""
    rng = random.Random(seed)
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    allowed = halted = failed = 0
    for _ in range(max_calls):
        estimate = rng.choice([0.01, 0.02, 0.05])
        actual = round(estimate * rng.uniform(0.2, 1.0), 6)
        fail = rng.random() < 0.1

        def body() -> None:
            report_usage(cost_usd=actual)
            if fail:
                raise RuntimeError("provider 500")

        d = ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=estimate))
        if d == Decision.ALLOW:
            allowed += 1
        elif d == Decision.RETRY:
            failed += 1
        else:
            halted += 1
            if ctx.get_snapshot().aborted:
                break
    ctx.close()
    coord.close()
    out.put({"allowed": allowed, "halted": halted, "failed": failed})


def hold_call(url: str, token: str, lease_ms: int, ready: Any) -> None:
    """Reserve a $0.30 call and block inside it forever (the test SIGKILLs us)."""
    coord = _coord(url, lease_ms=lease_ms)
    ctx = ExecutionContext.attach(token, coordinator=coord)

    def body() -> None:
        ready.set()
        time.sleep(3600)

    ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.30, operation_name="doomed"))


def wait_for_cancel(url: str, token: str, use_async: bool, ready: Any, out: Any) -> None:
    """Run a long call in an attached child; report how it ended and when."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)

    def sync_body() -> None:
        ready.set()
        tok = current_cancellation_token()
        assert tok is not None
        while True:  # a synchronous function polls its token
            tok.raise_if_cancelled()
            time.sleep(0.005)

    async def async_body() -> None:
        ready.set()
        await asyncio.sleep(3600)

    if use_async:
        decision = asyncio.run(ctx.awrap_llm_call(async_body, WrapOptions(cost_estimate_hint=0.1)))
    else:
        decision = ctx.wrap_llm_call(sync_body, WrapOptions(cost_estimate_hint=0.1))
    ended = time.time()
    after = ctx.wrap_llm_call(lambda: None)
    snap = ctx.get_snapshot()
    out.put({"decision": decision.value, "ended": ended, "after": after.value,
             "status": snap.nodes[0].status if snap.nodes else None,
             "aborted": snap.aborted, "reason": snap.abort_reason})
    ctx.close()
    coord.close()


def spend_and_exit(url: str, token: str) -> None:
    """One settled call, then exit without closing anything: the atexit flush must land
    the write-behind settle."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.07), WrapOptions(cost_estimate_hint=0.1))


def token_agent(url: str, token: str, out: Any) -> None:
    """A sub-agent that tries 500-token calls (300 in + max 200 out) until refused."""
    from coordinator.errors import PromptEvaluationError

    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    agent = ctx.spawn_child()
    done = refused = 0
    for _ in range(3):
        try:
            agent.evaluate(
                lambda: report_usage(input_tokens=300, output_tokens=200, provider="openai"),
                WrapOptions(provider="openai", input_tokens_estimate=300, max_output_tokens=200),
            )
            done += 1
        except PromptEvaluationError as exc:
            assert exc.phase == "token_budget", exc
            refused += 1
    agent.close()
    coord.close()
    out.put({"done": done, "refused": refused})


def soak_agent(url: str, token: str, seed: int, seconds: float, ready: Any, out: Any
               ) -> None:
    """Spend for ``seconds`` through an attached child, riding out a Redis restart: calls
    refused because Redis is away are retried after a pause; the agent ends when its
    tree stops it or the time is up."""
    rng = random.Random(seed)
    coord = _coord(url, lease_ms=1500)
    ctx = ExecutionContext.attach(token, coordinator=coord).spawn_child()
    ready.put(seed)
    counts = {"allowed": 0, "retry": 0, "halted": 0, "offline": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        estimate = rng.choice([0.002, 0.005, 0.01])
        actual = round(estimate * rng.uniform(0.3, 1.0), 6)
        fail = rng.random() < 0.05

        def body() -> None:
            report_usage(cost_usd=actual, input_tokens=100, output_tokens=20,
                         provider="openai")
            if fail:
                raise RuntimeError("provider 502")

        d = ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=estimate,
                                                input_tokens_estimate=100,
                                                max_output_tokens=50, provider="openai"))
        if d == Decision.ALLOW:
            counts["allowed"] += 1
        elif d == Decision.RETRY:
            counts["retry"] += 1
        elif ctx.stop_reason is None:
            counts["offline"] += 1  # Redis away (or a call that did not fit): try again
            time.sleep(0.05)
        else:
            counts["halted"] += 1
            break
    while True:  # make sure every queued settle lands before reporting
        try:
            coord.store.flush()
            break
        except Exception:  # noqa: BLE001 - Redis may still be restarting
            time.sleep(0.1)
    ctx.close()
    coord.close()
    out.put(counts)
