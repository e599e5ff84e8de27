"""Bodies of the OS processes that the quota tests start (multiprocessing, spawn)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from coordinator import (
    ChainMetadata,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    report_usage,
)
from coordinator.context.wrap import run_sync
from tests.support.procs import _coord

CALL_USD = 0.01


def labelled(user: str, team: str = "research") -> ChainMetadata:
    """The metadata of a new root labelled with a team and a user."""
    cid = uuid.uuid4().hex
    return ChainMetadata(request_id=cid, chain_id=cid, team=team, user_id=user)


def spend_until_refused(url: str, user: str, lease: bool, out: Any) -> None:
    """Open trees (each with its own $0.05 ceiling) labelled with ``user`` and make $0.01
    calls until a quota refuses one; report every tree, call and refusal."""
    coord = _coord(url)
    config = ExecutionConfig(max_cost_usd=0.05, max_steps=1000, max_retries_total=10,
                             lease=LeasePolicy(usd=0.02, steps=10, tokens=None,
                                               max_age_ms=500) if lease else None)
    roots, calls, refusals = [], 0, []
    opts = WrapOptions(cost_estimate_hint=CALL_USD)
    end = time.monotonic() + 90
    while not refusals and time.monotonic() < end:
        with ExecutionContext(config, metadata=labelled(user), coordinator=coord) as ctx:
            roots.append(ctx.chain_id)
            while True:
                outcome = run_sync(ctx._state, ctx, "llm",
                                   lambda: report_usage(cost_usd=CALL_USD), opts)
                if outcome.decision == Decision.ALLOW:
                    calls += 1
                    continue
                if outcome.reason == "backend_unavailable" and time.monotonic() < end:
                    time.sleep(0.5)  # Redis stalled (a loaded machine): fail closed, retry
                    continue
                if outcome.reason != "budget_exceeded":  # not the tree's own ceiling
                    refusals.append({"reason": outcome.reason, "detail": outcome.detail,
                                     "stopped": ctx.stop_reason})
                break
    coord.close()
    out.put({"user": user, "roots": roots, "calls": calls, "refusals": refusals})


def hold_grant(url: str, user: str, ready: Any) -> None:
    """Make five $0.01 calls (a grant taken), write them, then wait to be SIGKILLed with
    the grant held and one more call's reservation in flight."""
    coord = _coord(url, lease_ms=1500)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1000,
                                           max_retries_total=10),
                           metadata=labelled(user), coordinator=coord)
    for _ in range(5):
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=CALL_USD),
                                 WrapOptions(cost_estimate_hint=CALL_USD)) == Decision.ALLOW
    coord.store.flush()

    def stuck() -> None:
        ready.put(ctx.chain_id)
        time.sleep(3600)

    ctx.wrap_llm_call(stuck, WrapOptions(cost_estimate_hint=CALL_USD))


def hold_after_calls(url: str, user: str, calls: int, ready: Any) -> None:
    """Make ``calls`` $0.01 calls (strict mode, a grant taken), write them, report the
    root, then wait to be SIGKILLed with the grant held and nothing in flight."""
    coord = _coord(url, lease_ms=1500)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1000,
                                           max_retries_total=10),
                           metadata=labelled(user), coordinator=coord)
    for _ in range(calls):
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=CALL_USD),
                                 WrapOptions(cost_estimate_hint=CALL_USD)) == Decision.ALLOW
    coord.store.flush()
    ready.put(ctx.chain_id)
    time.sleep(3600)
