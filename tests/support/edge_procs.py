"""Bodies of the processes the degrade and final-reserve tests start (multiprocessing,
spawn): each attaches to a shared root by token and spends until refused."""

from __future__ import annotations

from typing import Any

from coordinator import (
    Coordinator,
    Decision,
    ExecutionContext,
    WrapOptions,
    current_call,
    report_usage,
)
from tests.support.procs import TEST_KEYS

LADDER_CALL = WrapOptions(model="gpt-4o", provider="openai", input_tokens_estimate=1000,
                          max_output_tokens=1000)
"""A gpt-4o call whose worst case (1,000 tokens each way) is what it reports."""


def run_ladder_calls(url: str, token: str, start: Any, out: Any) -> None:
    """Make LADDER_CALL calls (each reporting its worst case at the model it ran on)
    until one is refused; put the models that ran."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    models: list[str | None] = []

    def call() -> None:
        info = current_call()
        assert info is not None
        models.append(info.model)
        report_usage(input_tokens=1000, output_tokens=1000, model=info.model)

    start.wait(30)
    while ctx.wrap_llm_call(call, LADDER_CALL) == Decision.ALLOW:
        pass
    out.put(models)
    ctx.detach()
    coord.close()


def run_cent_calls(url: str, token: str, final: bool, start: Any, out: Any) -> None:
    """Make $0.01 calls (final or ordinary) until one is refused; put how many ran and
    the stop this handle heard (None: its context still runs)."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    options = WrapOptions(cost_estimate_hint=0.01, final=final)
    ran = 0
    start.wait(30)
    while ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01), options) == Decision.ALLOW:
        ran += 1
    out.put((ran, ctx.stop_reason))
    ctx.detach()
    coord.close()
