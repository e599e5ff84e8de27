"""Degraded calls for the tests of what shows them (snapshots, spans, budgetctl, the
dashboard): a root whose model ladder runs gpt-4o calls on gpt-4o-mini once less than half
of a ceiling is left, and calls that report their usage at the model that ran; also the
body of an OS process that makes such calls through a token (multiprocessing, spawn)."""

from __future__ import annotations

from typing import Any

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    Degrade,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_call,
    report_usage,
)
from tests.support.procs import TEST_KEYS

LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.5)
GPT4O = WrapOptions(model="gpt-4o", provider="openai", input_tokens_estimate=1000,
                    max_output_tokens=1000, operation_name="answer")
GPT4O_USD = 0.0125
"""1,000 tokens in and out on gpt-4o (the shipped price table)."""
MINI_USD = 0.00075
"""The same on gpt-4o-mini."""
PLAIN = WrapOptions(cost_estimate_hint=0.002, operation_name="lookup")
"""An ordinary $0.002 call that names no model."""


def ladder_config(usd: float = 0.10, **kw: Any) -> ExecutionConfig:
    """A root of ``usd`` with the ladder: gpt-4o while at least half of it is left."""
    return ExecutionConfig(max_cost_usd=usd, max_steps=1000, max_retries_total=10,
                           degrade=LADDER, **kw)


def open_root(coord: Coordinator, chain_id: str, usd: float = 0.10, **kw: Any
              ) -> ExecutionContext:
    return ExecutionContext(ladder_config(usd, **kw), coordinator=coord,
                            metadata=ChainMetadata(chain_id=chain_id, service="agent"))


def ask(ctx: ExecutionContext, options: WrapOptions = GPT4O) -> Decision:
    """One call asking for gpt-4o, reporting 1,000 tokens each way at the model that ran."""
    def body() -> None:
        call = current_call()
        assert call is not None
        report_usage(input_tokens=1000, output_tokens=1000, model=call.model)
    return ctx.wrap_llm_call(body, options)


def edge_tree(coord: Coordinator) -> tuple[ExecutionContext, ExecutionContext]:
    """A $0.10 root (ladder below half, a $0.03 final reserve, a warning at 50%) that ran
    5 calls on gpt-4o and 1 on gpt-4o-mini; its child ran 1 on gpt-4o-mini, then 3
    ordinary $0.002 calls up to the reserve, and had 3 refused by it."""
    root = open_root(coord, "edge-tree", final_reserve_usd=0.03, warn_at=(0.5,))
    kid = root.spawn_child(max_cost_usd=0.05)
    assert [ask(root) for _ in range(6)] == [Decision.ALLOW] * 6
    assert ask(kid) == Decision.ALLOW
    spent = [kid.wrap_llm_call(lambda: report_usage(cost_usd=0.002), PLAIN) for _ in range(6)]
    assert spent == [Decision.ALLOW] * 3 + [Decision.HALT] * 3
    assert kid.stop_reason is None  # a refusal of the reserve stops nothing
    coord.store.flush()
    return root, kid


def ask_in_process(url: str, token: str, calls: int, out: Any) -> None:
    """Make ``calls`` gpt-4o calls through an attached context; report their decisions."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    decisions = [ask(ctx).value for _ in range(calls)]
    ctx.close()
    coord.close()
    out.put(decisions)
