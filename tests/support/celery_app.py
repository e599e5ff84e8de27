"""The Celery app the integration tests run in real worker subprocesses.

Configured from the environment (set by tests/support/celery_app_harness.py): ``BC_BROKER_URL``,
``BC_BACKEND_URL``, ``BC_QUEUE``, and ``BC_MARK_URL``, a Redis database where tasks
leave markers (started, ended, runs) that the tests read.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis
from celery import Celery

from coordinator import Decision, WrapOptions, report_usage
from coordinator.celery import contained, current_cancellation_token, current_context, install

app = Celery("bc_tests")
app.conf.update(
    broker_url=os.environ.get("BC_BROKER_URL", "memory://"),
    result_backend=os.environ.get("BC_BACKEND_URL") or None,
    task_default_queue=os.environ.get("BC_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    # long tasks: a worker holds no more messages than it has processes to run them
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
install(app)

_marks: redis.Redis | None = None


def marks() -> redis.Redis:
    """The marker database (one client per process)."""
    global _marks
    if _marks is None:
        _marks = redis.Redis.from_url(os.environ["BC_MARK_URL"], decode_responses=True)
    return _marks


def _where() -> dict[str, Any]:
    ctx = current_context()
    assert ctx is not None
    return {"path": list(ctx.path), "chain_id": ctx.chain_id, "pid": os.getpid()}


@app.task(bind=True)
@contained()
def probe(self: Any, *_results: Any) -> dict[str, Any]:
    """Where am I in the tree? (accepts and ignores chained results)"""
    marks().rpush("runs", self.request.id)
    return {**_where(), "task_id": self.request.id}


@app.task
def plain_probe() -> str:
    """A task without @contained: returns the header it received (or '')."""
    from coordinator.celery import incoming_token

    return incoming_token(plain_probe.request) or ""


@app.task(bind=True)
@contained()
def collect(self: Any, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A chord callback: where am I, and what did the header tasks report?"""
    return {**_where(), "results": results}


@app.task(bind=True)
@contained()
def fan_out(self: Any, n: int) -> list[dict[str, Any]]:
    """Send n probes from inside a contained task and wait for them."""
    sent = [probe.delay() for _ in range(n)]
    return [r.get(timeout=30, disable_sync_subtasks=False) for r in sent]


@app.task(bind=True)
@contained()
def fire_and_forget(self: Any, n: int, cost: float) -> list[str]:
    """Send n sub-agents and return at once: they start after this body returned."""
    return [llm_agent.delay(1, cost).id for _ in range(n)]


@app.task(bind=True)
@contained(max_cost_usd=5.0)
def llm_agent(self: Any, calls: int, cost: float, meet: int = 1) -> dict[str, Any]:
    """A sub-agent making up to ``calls`` LLM calls whose estimate equals their cost. It
    first waits (up to 30 s) until agents have started in ``meet`` processes, so that a
    fan-out is spread over processes however fast the first one runs; the processes of
    agents that made a call are in the marks' set ``calling_pids``."""
    ctx = current_context()
    assert ctx is not None
    m = marks()
    m.sadd("agent_pids", os.getpid())
    deadline = time.monotonic() + 30
    while m.scard("agent_pids") < meet and time.monotonic() < deadline:
        time.sleep(0.01)
    done = 0
    for i in range(calls):
        decision = ctx.wrap_llm_call(
            lambda: report_usage(cost_usd=cost, input_tokens=800, output_tokens=200,
                                 model="gpt-4o-mini", provider="openai"),
            WrapOptions(operation_name=f"call {i}", cost_estimate_hint=cost),
        )
        if decision != Decision.ALLOW:
            break
        done += 1
    if done:
        m.sadd("calling_pids", os.getpid())
    return {"calls": done, **_where()}


@app.task(bind=True)
@contained()
def busy(self: Any, mode: str, estimate: float = 0.0) -> str:
    """Runs for a minute unless stopped: ``sleep`` (time.sleep), ``loop`` (a Python
    loop), ``llm`` (time.sleep inside a wrapped call holding ``estimate``) or ``poll``
    (waits on its cancellation token)."""
    m = marks()
    m.rpush("started", f"{self.request.id}:{os.getpid()}")
    try:
        if mode == "sleep":
            time.sleep(60)
        elif mode == "loop":
            end = time.monotonic() + 60
            n = 0
            while time.monotonic() < end:
                n += 1
        elif mode == "poll":
            token = current_cancellation_token()
            assert token is not None
            token.wait(60)
            token.raise_if_cancelled()
        else:
            ctx = current_context()
            assert ctx is not None
            ctx.wrap_llm_call(lambda: time.sleep(60),
                              WrapOptions(operation_name="slow call",
                                          cost_estimate_hint=estimate))
            token = current_cancellation_token()
            assert token is not None
            token.raise_if_cancelled()
        return "finished"
    finally:
        m.rpush("ended", repr(time.time()))


@app.task(bind=True, max_retries=20)
@contained()
def flaky(self: Any) -> str:
    """Always asks Celery to retry itself (each retry is charged to the retry budget)."""
    marks().rpush("runs", self.request.id)
    raise self.retry(countdown=0)


@app.task(bind=True)
@contained(max_cost_usd=0.10, max_steps=5, max_retries_total=1)
def solo(self: Any) -> dict[str, Any]:
    """Sent without a context: opens a root of its own."""
    return {**_where(), "task_id": self.request.id}


@app.task(bind=True)
@contained(interrupt=False)
def awaiting(self: Any, estimate: float) -> str:
    """Awaits a wrapped coroutine call for a minute unless its context is stopped (the
    core cancels it; no interrupt is forced into the event loop)."""
    m = marks()
    m.rpush("started", f"{self.request.id}:{os.getpid()}")

    async def agent() -> None:
        ctx = current_context()
        assert ctx is not None
        await ctx.awrap_llm_call(lambda: asyncio.sleep(60),
                                 WrapOptions(operation_name="slow async call",
                                             cost_estimate_hint=estimate))

    try:
        asyncio.run(agent())
        token = current_cancellation_token()
        assert token is not None
        token.raise_if_cancelled()
        return "finished"
    finally:
        m.rpush("ended", repr(time.time()))


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
@contained()
def resumable(self: Any) -> dict[str, Any]:
    """The same two calls in every delivery: a $0.10 call that settles, then a call that
    never ends in the first delivery (its process gets killed) and costs $0.05 when the
    redelivered message replays it. Every run of a call body is counted in Redis."""
    m = marks()
    m.rpush("started", f"{self.request.id}:{os.getpid()}")
    ctx = current_context()
    assert ctx is not None
    delivery = m.incr(f"deliveries:{self.request.id}")

    def first_call() -> None:
        m.incr(f"runs:first:{self.request.id}")
        report_usage(cost_usd=0.10)

    def second_call() -> None:
        m.incr(f"runs:second:{self.request.id}")
        if delivery == 1:
            time.sleep(60)
        report_usage(cost_usd=0.05)

    ctx.wrap_llm_call(first_call, WrapOptions(operation_name="settles", cost_estimate_hint=0.10))
    ctx.wrap_llm_call(second_call,
                      WrapOptions(operation_name="killed, replayed", cost_estimate_hint=0.30))
    return _where()
