"""Round trip of a ``@contained`` no-op Celery task against a plain no-op task, measured
side by side in one run (interleaved), on a Redis broker and result backend.

    .venv/bin/python bench/bench_celery_overhead.py [rounds] [--warm-up 20]

Starts its own redis-server and one Celery worker (prefork, one process). Prints the p50
and p90 round trip of each kind and the p50 ratio (target: at most 1.10). The kinds run
in a random order each round, 3 ms apart. A plain task
making one Redis round trip is measured too: the floor of a context opened (and checked
for a stop above) before the body runs. Each ratio comes with its 95 % bootstrap interval
(this run's sampling; drift between runs is larger).
"""

from __future__ import annotations

import argparse
import contextvars
import os
import random
import statistics
import sys
import time
import uuid
from typing import Any

import redis
from celery import Celery

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.short_run import parse  # noqa: E402
from bench.timing import median_ratio_interval  # noqa: E402
from coordinator.celery import contained, install  # noqa: E402

PAUSE_S = 0.003

app = Celery("bench_overhead")
app.conf.update(
    broker_url=os.environ.get("BC_BROKER_URL", "memory://"),
    result_backend=os.environ.get("BC_BACKEND_URL") or None,
    task_default_queue=os.environ.get("BC_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
install(app)


@app.task(name="bench.plain_noop")
def plain_noop() -> None:
    """Does nothing."""


@app.task(name="bench.contained_noop")
@contained(max_cost_usd=1.0, max_steps=10, max_retries_total=1)
def contained_noop() -> None:
    """Does nothing, inside an ExecutionContext."""


_ping_client: redis.Redis | None = None


@app.task(name="bench.round_trip_noop")
def round_trip_noop() -> None:
    """One Redis round trip (a PING): the floor of any check made before a body runs."""
    global _ping_client
    if _ping_client is None:
        _ping_client = redis.Redis.from_url(os.environ["BUDGET_REDIS_URL"])
    _ping_client.ping()


def _send_in(ctx: Any) -> Any:
    """What a send inside ``with ctx:`` does (the block itself would close ``ctx``)."""
    ctx.__enter__()
    return contained_noop.apply_async()


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main(rounds: int, warm_up: int) -> None:
    from coordinator import Coordinator, ExecutionConfig, ExecutionContext
    from coordinator.embedded import RedisServer
    from tests.support.celery_app_harness import TOKEN_KEYS, Workers

    with RedisServer() as server:
        base = f"redis://127.0.0.1:{server.port}"
        env = {"BC_BROKER_URL": base + "/1", "BC_BACKEND_URL": base + "/2",
               "BC_QUEUE": f"bench-{uuid.uuid4().hex[:8]}", "BUDGET_REDIS_URL": base + "/0",
               "BUDGET_TOKEN_KEYS": TOKEN_KEYS, "PYTHONWARNINGS": "ignore"}
        os.environ.update(env)
        app.conf.update(broker_url=env["BC_BROKER_URL"], result_backend=env["BC_BACKEND_URL"],
                        task_default_queue=env["BC_QUEUE"])
        kid, _, secret = TOKEN_KEYS.partition(":")
        coord = Coordinator.from_url(base + "/0", token_keys={kid: secret.encode()})
        with Workers(app, "bench.bench_celery_overhead", env, count=1, concurrency=1):
            kinds: dict[str, list[float]] = {"plain": [], "plain + one Redis round trip": [],
                                             "contained (root)": [],
                                             "contained (child of a context)": []}
            cfg = ExecutionConfig(max_cost_usd=100.0, max_steps=100_000,
                                  max_retries_total=10)
            parent = ExecutionContext(cfg, coordinator=coord)
            order = list(kinds)
            shuffle = random.Random(0).shuffle
            for i in range(rounds + warm_up):  # the first rounds warm up
                # In a random order, with a pause: what a task leaves to do after its
                # result (a contained task closes its context) must not be charged to
                # whichever kind happens to follow it.
                shuffle(order)
                for kind in order:
                    time.sleep(PAUSE_S)
                    t0 = time.perf_counter()
                    if kind == "plain":
                        plain_noop.apply_async().get(10)
                    elif kind == "plain + one Redis round trip":
                        round_trip_noop.apply_async().get(10)
                    elif kind == "contained (root)":
                        contained_noop.apply_async().get(10)
                    else:  # sent inside the context: the token travels in the header
                        contextvars.copy_context().run(_send_in, parent).get(10)
                    if i >= warm_up:
                        kinds[kind].append((time.perf_counter() - t0) * 1000)
            parent.close()
        coord.close()
    plain = kinds["plain"]
    print(f"Celery no-op task round trip, Redis broker+backend, 1 prefork worker process, "
          f"{rounds} rounds, kinds in a random order, {PAUSE_S * 1000:.0f} ms apart; "
          f"p50 ratio to plain with its 95 % bootstrap interval")
    for kind, values in kinds.items():
        p50 = statistics.median(values)
        low, high = median_ratio_interval(values, plain)
        print(f"  {kind:32s} p50 {p50:6.2f} ms  p90 {_p(values, 90):6.2f} ms  "
              f"p50 ratio to plain {p50 / statistics.median(plain):.3f} "
              f"[{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", type=int, nargs="?", default=300)
    ap.add_argument("--warm-up", type=int, default=20, help="rounds not counted")
    args = parse(ap, rounds=3, warm_up=1)
    main(args.rounds, args.warm_up)
