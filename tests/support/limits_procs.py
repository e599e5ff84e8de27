"""Bodies of the processes the set_limits tests start (multiprocessing, spawn)."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Coordinator, ExecutionContext, WrapOptions, report_usage
from tests.support.procs import TEST_KEYS


def spend_steadily(url: str, token: str, cost_usd: float, stop: Any, out: Any) -> None:
    """Make a call of ``cost_usd`` every 20 ms through an attached context until ``stop``
    is set, reporting each decision and when it came (time.time())."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    options = WrapOptions(cost_estimate_hint=cost_usd)
    while not stop.is_set():
        decision = ctx.wrap_llm_call(lambda: report_usage(cost_usd=cost_usd), options)
        out.put((decision.value, time.time()))
        time.sleep(0.02)
    ctx.close()
    coord.close()
