"""Processes for the fault tests: an agent that makes calls on one tree through a fault
and reports when each call was decided and how."""

from __future__ import annotations

import time
from typing import Any


def timed_agent(url: str, token: str, seconds: float, ready: Any, out: Any,
                durability: str = "local", pause_s: float = 0.02) -> None:
    """Make a small call every ``pause_s`` for ``seconds`` on the context of ``token``;
    put on ``out`` the list of (wall time, allowed, reason) of every decision."""
    from coordinator import Coordinator, Decision, ExecutionContext, WrapOptions
    from tests.support.procs import TEST_KEYS

    coord = Coordinator.from_url(url, token_keys=TEST_KEYS, durability=durability,
                                 wait_timeout_ms=500)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.0001))  # warm up
    ready.put(True)
    decisions: list[tuple[float, bool, str]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        d = ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.0001))
        decisions.append((time.time(), d == Decision.ALLOW, ctx.stop_reason or ""))
        time.sleep(pause_s)
    try:
        coord.close()
    finally:
        out.put(decisions)
