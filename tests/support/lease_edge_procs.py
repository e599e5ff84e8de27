"""Bodies of the processes the lease-mode degrade and final-reserve tests start
(multiprocessing, spawn): each attaches to a shared root in lease mode by token and
spends until the tree has nothing left for it."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Coordinator, Decision, ExecutionContext, WrapOptions, report_usage
from tests.support.procs import TEST_KEYS

QUIET_S = 1.0
"""A process stops once its calls were refused this long without a break: longer than
a slice's timed flush and than the retry pause after a refused take, so the slices of
the other processes (whose unspendable rest is what refused it) are given back by then
(at their next refill, or at their process's exit)."""


def cents_until_quiet(url: str, token: str, start: Any, out: Any) -> None:
    """Make ordinary $0.01 calls until refused for QUIET_S without a break; put how many
    ran, the reasons of the refusals and the stop this handle heard (None: running)."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    options = WrapOptions(cost_estimate_hint=0.01)
    ran, refused_since = 0, None
    start.wait(30)
    end = time.monotonic() + 60
    while time.monotonic() < end and ctx.stop_reason is None:
        if ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01), options) == Decision.ALLOW:
            ran, refused_since = ran + 1, None
            continue
        refused_since = refused_since or time.monotonic()
        if time.monotonic() - refused_since > QUIET_S:
            break
        time.sleep(0.005)
    ctx.detach()
    out.put((ran, ctx.stop_reason))
    coord.close()
