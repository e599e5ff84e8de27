"""Closed trees whose calls name two providers, three models and none: the spend by
provider and model the day's views must show (tests/test_spend_models*.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from coordinator import (
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from tests.support.dashboard_server import open_tree

CALLS = {
    "labelled-run": [("openai", "gpt-4o", 0.25), ("anthropic", "claude-3-haiku", 0.125),
                     ("openai", "gpt-4o", 0.0625)],
    "bare-run": [("openai", "gpt-4o-mini", 0.5), (None, None, 0.03125)],
}
"""Per tree: (provider, model, USD) of each call; the last call names no model."""
EXPECTED = {"openai|gpt-4o": 312_500, "anthropic|claude-3-haiku": 125_000,
            "openai|gpt-4o-mini": 500_000, "unknown": 31_250}
"""Micro-USD by provider|model of the trees closed."""
TOTAL_MICRO = 968_750


def close_trees(coord: Coordinator) -> None:
    """Open the trees (one labelled, one not), make their calls, close them."""
    trees = {"labelled-run": open_tree(coord, "labelled-run", ceiling=2.0)}
    with ThreadPoolExecutor(1) as pool:  # (see open_tree: a root opens on its thread)
        trees["bare-run"] = pool.submit(
            ExecutionContext, ExecutionConfig(max_cost_usd=2.0, max_steps=10,
                                              max_retries_total=1),
            coordinator=coord, metadata=ChainMetadata(request_id="r", chain_id="bare-run")
        ).result()
    for name, ctx in trees.items():
        for provider, model, usd in CALLS[name]:
            def body(usd: float = usd) -> None:
                report_usage(cost_usd=usd)
            ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=usd, provider=provider,
                                                model=model))
        ctx.close()
