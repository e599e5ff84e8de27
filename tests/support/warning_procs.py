"""Bodies of the processes the budget warning tests start (multiprocessing, spawn)."""

from __future__ import annotations

from typing import Any

from coordinator import Coordinator, ExecutionContext, WrapOptions, report_usage
from tests.support.procs import TEST_KEYS


def hear_warnings(url: str, token: str, ready: Any, done: Any, out: Any) -> None:
    """Attach the context ``token`` names, report every budget warning its handle hears
    (``BudgetWarning.model_dump()``) on ``out`` until ``done`` is set."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ctx.on_warning(lambda warning: out.put(warning.model_dump()))
    ready.set()
    done.wait(120)
    ctx.close()
    coord.close()


def spend_in_a_child(url: str, token: str, calls: int, cost_usd: float, go: Any,
                     out: Any) -> None:
    """Open a child of the context ``token`` names and, once ``go`` is set, make
    ``calls`` calls of ``cost_usd`` in it; report the decisions."""
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    child = ExecutionContext.spawn_from_token(token, coordinator=coord)
    options = WrapOptions(cost_estimate_hint=cost_usd)
    go.wait(60)
    decisions = [child.wrap_llm_call(lambda: report_usage(cost_usd=cost_usd), options).value
                 for _ in range(calls)]
    child.close()
    coord.close()
    out.put(decisions)
