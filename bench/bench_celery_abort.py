"""Abort latency: from ``abort()`` to the last of the running tasks observing it, across
two Celery workers, against Celery's own nearest mechanism, in the same run.

    .venv/bin/python bench/bench_celery_abort.py [trials]

* threads pool, 2 workers x 50 threads, 100 running tasks: ``ExecutionContext.abort()``
  (tasks wait on their cancellation token) vs ``AbortableAsyncResult.abort()`` for each
  task (``celery.contrib.abortable``: tasks poll ``is_aborted()`` every 10 ms);
  ``revoke(terminate=True)`` does not stop a running task on the threads pool.
* prefork pool, 2 workers x 4 processes, 8 tasks blocked in ``time.sleep``:
  ``abort()`` (interrupted by a signal) vs ``revoke(terminate=True)`` (SIGTERM).

Each task records when it observed the stop (same machine clock; the stamps are sent
20 ms later, so that reporting them does not slow the tasks still to observe theirs); a
trial's latency is the last observation minus the moment the stop was issued. Prints
p50 and max over the trials.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery
from celery.contrib.abortable import AbortableAsyncResult, AbortableTask

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.short_run import parse  # noqa: E402
from coordinator.celery import (  # noqa: E402
    TaskInterrupted,
    contained,
    current_cancellation_token,
    install,
)

app = Celery("bench_abort")
app.conf.update(
    broker_url=os.environ.get("BC_BROKER_URL", "memory://"),
    result_backend=os.environ.get("BC_BACKEND_URL") or None,
    task_default_queue=os.environ.get("BC_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
)
install(app)
_marks: redis.Redis | None = None


_observed: list[str] = []
_observed_lock = threading.Lock()


def _mark(key: str, *values: str) -> None:
    global _marks
    if _marks is None:
        _marks = redis.Redis.from_url(os.environ["BC_MARK_URL"])
    _marks.rpush(key, *values)


def _observe() -> None:
    """Record when this task observed the stop. The stamp is sent 20 ms later by another
    thread: a round trip per task at once would delay the tasks still to observe theirs
    (they share the GIL), and measure the measurement."""
    stamp = repr(time.time())
    with _observed_lock:
        _observed.append(stamp)
        if len(_observed) == 1:
            threading.Timer(0.02, _send_observed).start()


def _send_observed() -> None:
    with _observed_lock:
        stamps = _observed[:]
        _observed.clear()
    _mark("observed", *stamps)


@app.task(name="bench.token_wait")
@contained(interrupt=False)
def token_wait() -> None:
    """Waits on its cancellation token (threads pool)."""
    token = current_cancellation_token()
    assert token is not None
    _mark("started", "1")
    token.wait(120)
    _observe()


@app.task(name="bench.abortable_wait", base=AbortableTask, bind=True)
def abortable_wait(self: Any) -> None:
    """Polls Celery's abort flag every 10 ms (threads pool)."""
    _mark("started", "1")
    end = time.monotonic() + 120
    while not self.is_aborted() and time.monotonic() < end:
        time.sleep(0.01)
    _observe()


@app.task(name="bench.sleep_contained")
@contained()
def sleep_contained() -> None:
    """Blocked in time.sleep until interrupted (prefork)."""
    _mark("started", "1")
    try:
        time.sleep(120)
    except TaskInterrupted:
        _observe()
        raise


@app.task(name="bench.sleep_plain")
def sleep_plain() -> None:
    """Blocked in time.sleep until revoke(terminate=True) sends SIGTERM (prefork)."""
    def on_term(signum: int, frame: Any) -> None:
        _mark("observed", repr(time.time()))
        os._exit(1)

    signal.signal(signal.SIGTERM, on_term)
    _mark("started", "1")
    time.sleep(120)


def _trial(marks: redis.Redis, n: int, send: Any, stop: Any) -> float:
    marks.delete("started", "observed")
    handles = send(n)
    deadline = time.monotonic() + 60
    while marks.llen("started") < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {marks.llen('started')} of {n} tasks started")
        time.sleep(0.01)
    time.sleep(0.05)  # all of them inside their wait
    t0 = time.time()
    stop(handles)
    while marks.llen("observed") < n:
        if time.monotonic() > deadline + 30:
            raise RuntimeError(f"only {marks.llen('observed')} of {n} observed the stop")
        time.sleep(0.002)
    return (max(float(x) for x in marks.lrange("observed", 0, -1)) - t0) * 1000


def _report(label: str, values: list[float]) -> None:
    print(f"  {label:58s} p50 {statistics.median(values):7.1f} ms   max "
          f"{max(values):7.1f} ms")


def main(trials: int) -> None:
    from coordinator import Coordinator, ExecutionConfig, ExecutionContext
    from coordinator.embedded import RedisServer
    from tests.support.celery_app_harness import TOKEN_KEYS, Workers

    with RedisServer() as server:
        base = f"redis://127.0.0.1:{server.port}"
        marks = redis.Redis.from_url(base + "/3")
        kid, _, secret = TOKEN_KEYS.partition(":")
        coord = Coordinator.from_url(base + "/0", token_keys={kid: secret.encode()})
        cfg = ExecutionConfig(max_cost_usd=100.0, max_steps=100_000, max_retries_total=10)

        def by_abort(task: Any) -> tuple[Any, Any]:
            def send(n: int) -> Any:
                root = ExecutionContext(cfg, coordinator=coord)
                for _ in range(n):
                    task.apply_async(headers={"budget_context": root.token})
                return root

            def stop(root: Any) -> None:
                root.abort("bench")
                root.close()
            return send, stop

        def by_abortable(n: int) -> Any:
            return [abortable_wait.delay().id for _ in range(n)]

        def by_revoke(n: int) -> Any:
            return [sleep_plain.delay().id for _ in range(n)]

        for pool, concurrency, n, pairs in (
            ("threads", 50, 100, [
                ("budget abort(), tasks wait on their token", *by_abort(token_wait)),
                ("celery AbortableAsyncResult.abort() x100, 10 ms polling", by_abortable,
                 lambda ids: [AbortableAsyncResult(i, app=app).abort() for i in ids]),
            ]),
            ("prefork", 4, 8, [
                ("budget abort(), tasks in time.sleep", *by_abort(sleep_contained)),
                ("celery revoke(terminate=True), tasks in time.sleep", by_revoke,
                 lambda ids: app.control.revoke(ids, terminate=True)),
            ]),
        ):
            env = {"BC_BROKER_URL": base + "/1", "BC_BACKEND_URL": base + "/2",
                   "BC_MARK_URL": base + "/3", "BC_QUEUE": f"bench-{uuid.uuid4().hex[:8]}",
                   "BUDGET_REDIS_URL": base + "/0", "BUDGET_TOKEN_KEYS": TOKEN_KEYS,
                   "PYTHONWARNINGS": "ignore"}
            os.environ.update(env)
            app.conf.update(broker_url=env["BC_BROKER_URL"], task_default_queue=env["BC_QUEUE"],
                            result_backend=env["BC_BACKEND_URL"])
            print(f"{pool} pool: 2 workers x {concurrency}, {n} running tasks, "
                  f"{trials} trials (latency of the last task to observe the stop)")
            with Workers(app, "bench.bench_celery_abort", env, count=2, pool=pool,
                         concurrency=concurrency):
                results: dict[str, list[float]] = {label: [] for label, _, _ in pairs}
                for _ in range(trials):  # interleaved, so both see the same load
                    for label, send, stop in pairs:
                        results[label].append(_trial(marks, n, send, stop))
                        time.sleep(0.3)  # let killed pool processes be replaced
                for label, values in results.items():
                    _report(label, values)
        coord.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("trials", type=int, nargs="?", default=20)
    main(parse(ap, trials=1).trials)
