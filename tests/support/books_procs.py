"""Body of the processes of the randomized books test (tests/store/test_books_random.py): seeded
calls that report validly, invalidly, in tokens of an unknown model or nothing, raise, or
are interrupted; each process adds up what the charging rule says its calls cost and
count."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from coordinator import Coordinator, Decision, ExecutionContext, WrapOptions, report_usage
from coordinator.core.amounts import usd_to_micro
from coordinator.errors import InvalidCostError
from tests.support.procs import TEST_KEYS

ACTIONS = ("valid", "valid_raise", "raise", "invalid_raise", "invalid_caught",
           "unknown_model", "nothing", "interrupt")
RETRIES = {"valid_raise", "raise", "invalid_raise"}
"""The actions whose run counts a retry (the others, the interrupted one included, count a
step)."""


class ProviderError(Exception):
    """A provider failure (a failed request is not billed)."""


def expected_micro(action: str, estimate: int, actual: int) -> int:
    """What the rule (docs/tokens.md) charges a run of ``action``: a valid report as
    reported; an invalid report, unpriced tokens or no report on return, the estimate
    (each estimate here is above the floor); a failure that reported nothing, $0; an
    interruption that reported nothing, its estimate."""
    if action in ("valid", "valid_raise"):
        return actual
    if action == "raise":
        return 0
    return estimate


def books_run(url: str, token: str, seed: int, calls: int, out: Any) -> None:
    """Run ``calls`` seeded calls in the context of ``token``; put the expected totals."""
    rng = random.Random(seed)
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    totals = {"runs": 0, "steps": 0, "retries": 0, "micro": 0, "halted": 0}
    for _ in range(calls):
        action = rng.choice(ACTIONS)
        estimate = rng.choice([1000, 2000, 5000])  # micro-USD, above the $0.0001 floor
        actual = rng.randint(1, estimate)
        ran: list[int] = []
        opts = WrapOptions(cost_estimate_hint=estimate / 1e6)
        if action == "interrupt":
            decision = asyncio.run(_interrupted(ctx, ran, estimate))
        else:
            try:
                decision = ctx.wrap_llm_call(
                    lambda a=action, c=actual, r=ran: _body(a, c, r), opts)
            except InvalidCostError:
                decision = Decision.RETRY  # raised as the wrap's typed error
        if not ran:
            totals["halted"] += decision == Decision.HALT
            continue
        totals["runs"] += 1
        totals["retries" if action in RETRIES else "steps"] += 1
        totals["micro"] += expected_micro(action, estimate, actual)
    ctx.close()
    coord.close()
    out.put(totals)


def _body(action: str, actual: int, ran: list[int]) -> str | None:
    ran.append(1)
    if action in ("valid", "valid_raise"):
        report_usage(cost_usd=actual / 1e6)
    if action in ("valid_raise", "raise"):
        raise ProviderError("503")
    if action == "invalid_raise":
        report_usage(cost_usd=random.choice([float("nan"), -1.0, 1e12]))
    if action == "invalid_caught":
        try:
            report_usage(input_tokens=-5)
        except InvalidCostError:
            pass
    if action == "unknown_model":
        report_usage(input_tokens=1000, output_tokens=1000, model="fine-tuned-unknown")
    return None


async def _interrupted(ctx: ExecutionContext, ran: list[int], estimate: int) -> Decision:
    async def slow() -> None:
        ran.append(1)
        await asyncio.sleep(10)

    return await ctx.awrap_llm_call(
        slow, WrapOptions(cost_estimate_hint=estimate / 1e6, timeout_ms=20))


__all__ = ["books_run", "expected_micro", "usd_to_micro"]
