"""Bodies of the OS processes that the lease-mode tests start (multiprocessing, spawn)."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Decision, ExecutionContext, WrapOptions, report_usage
from tests.support.procs import _coord


def hold_slice(url: str, token: str, lease_ms: int, ready: Any, flush: bool) -> None:
    """Serve 5 calls of $0.01 from a slice, flush them (with ``flush``; else neither the
    batch's timed flush nor the slice's age-out comes, as in a process killed before
    them, however late the test's SIGKILL lands), then hold the slice forever."""
    from coordinator.context import lease as lease_mode

    lease_mode.FLUSH_AFTER_S = 3600.0
    lease_mode.LeaseSlice._age_out = lambda self, slice_id: None  # type: ignore[method-assign]
    coord = _coord(url, lease_ms=lease_ms)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    for _ in range(5):
        d = ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                              WrapOptions(cost_estimate_hint=0.01))
        assert d == Decision.ALLOW, d
    from coordinator.context.lease_registry import slice_of

    lease = slice_of(ctx._state)
    assert lease is not None and lease.slice_id is not None
    if flush:
        lease.flush()
    ready.put(lease.slice_id)
    time.sleep(3600)


def run_until_stopped(url: str, token: str, ready: Any, out: Any) -> None:
    """Make quick calls in lease mode until one is refused; report when the stop reached
    this process, when each call's function started, and when the first refusal came."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    reached: list[float] = []
    ctx.cancellation_token.on_cancel(lambda _reason: reached.append(time.time()))
    starts: list[float] = []

    def body() -> None:
        starts.append(time.time())
        time.sleep(0.002)  # a quick tool call (and node records under the stream cap)
        report_usage(cost_usd=0.0001)

    opts = WrapOptions(cost_estimate_hint=0.0001)
    ready.put(1)
    refused_at = 0.0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if ctx.wrap_llm_call(body, opts) != Decision.ALLOW:
            refused_at = time.time()
            break
    after = [ctx.wrap_llm_call(body, opts) for _ in range(3)]
    ctx.close()
    coord.close()
    out.put({"reached": reached[0] if reached else None, "refused_at": refused_at,
             "calls": len(starts), "started_after": sum(s > reached[0] for s in starts)
             if reached else -1, "after": [a.value for a in after],
             "reason": ctx.stop_reason})


def share_the_rest(url: str, token: str, ready: Any, go: Any, out: Any) -> None:
    """Calls of $0.002 (5 ms each) from the moment ``go`` is set until the tree's budget is
    gone; report how many were allowed."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    opts = WrapOptions(cost_estimate_hint=0.002)

    def body() -> None:
        time.sleep(0.005)
        report_usage(cost_usd=0.002)

    ready.put(1)
    go.wait(60)
    allowed = 0
    end = time.monotonic() + 30
    while time.monotonic() < end:
        d = ctx.wrap_llm_call(body, opts)
        if d == Decision.ALLOW:
            allowed += 1
        elif ctx.stop_reason is not None:
            break
        else:
            time.sleep(0.002)  # a call that does not fit yet: slices elsewhere still hold
    ctx.close()
    coord.close()
    out.put({"allowed": allowed, "reason": ctx.stop_reason})
