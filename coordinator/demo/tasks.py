"""The Celery side of ``budgetctl demo``: sub-agents that call a simulated LLM (realistic
token counts and prices, no network). Workers load it with
``celery -A coordinator.demo.tasks worker``; it reads its broker and queue from
``BUDGET_DEMO_BROKER`` and ``BUDGET_DEMO_QUEUE``."""

from __future__ import annotations

import functools
import os
import random
import time
from typing import Any

from celery import Celery

from ..celery import contained, current_context, install
from ..core.usage import report_usage
from ..models import Decision, WrapOptions

QUEUE = os.environ.get("BUDGET_DEMO_QUEUE", "budgetctl-demo")

app = Celery("budgetctl_demo")
app.conf.update(
    broker_url=os.environ.get("BUDGET_DEMO_BROKER", "memory://"),
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_ignore_result=True,  # progress is read from the budget tree, not from results
    worker_enable_remote_control=False,  # no pidbox keys in a shared Redis
    worker_prefetch_multiplier=1,
    task_acks_late=True,  # with long tasks, no message waits behind a busy worker
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
install(app)

# USD per million tokens (input, output), list prices of late 2025.
PRICES = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "claude-sonnet-4": (3.00, 15.00),
}


def price(model: str, input_tokens: int, output_tokens: int) -> float:
    """The list price of one call."""
    p_in, p_out = PRICES[model]
    return (input_tokens * p_in + output_tokens * p_out) / 1_000_000


def simulated_llm(model: str, input_tokens: int, max_output: int, latency_s: float) -> str:
    """Wait like a model would, then report realistic usage (a little under the cap)."""
    time.sleep(latency_s)
    output = random.randint(max_output // 2, max_output)
    report_usage(cost_usd=price(model, input_tokens, output), input_tokens=input_tokens,
                 output_tokens=output, model=model, provider="openai"
                 if model.startswith("gpt") else "anthropic")
    return "..." * 3


@app.task(bind=True, name="budgetctl.demo.sub_agent")  # type: ignore[untyped-decorator]
@contained(max_cost_usd=0.12)
def sub_agent(self: Any, role: str, calls: int, model: str, latency_s: float) -> int:
    """A sub-agent: up to ``calls`` LLM calls of a few thousand tokens each, until its
    own cap or a ceiling above stops it. Returns the calls made."""
    ctx = current_context()
    assert ctx is not None
    made = 0
    for i in range(calls):
        input_tokens = random.randint(2_500, 6_000) + 1_500 * i  # the transcript grows
        max_output = 1_200
        decision = ctx.wrap_llm_call(
            functools.partial(simulated_llm, model, input_tokens, max_output,
                              latency_s * random.uniform(0.6, 1.4)),
            WrapOptions(operation_name=f"{role} step {i + 1}", model=model,
                        cost_estimate_hint=price(model, input_tokens, max_output),
                        input_tokens_estimate=input_tokens, max_output_tokens=max_output),
        )
        if decision != Decision.ALLOW:
            break
        made += 1
    return made
