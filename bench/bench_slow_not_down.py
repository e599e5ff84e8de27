"""Spurious refusals under CPU load: calls refused (HALT) while Redis is up the whole time,
with the breaker's rule of evidence against the rule it replaced, side by side in one run.

    .venv/bin/python bench/bench_slow_not_down.py [seconds] [burners_per_cpu]

One redis-server; ``burners_per_cpu`` (default 3) busy-looping processes per CPU saturate
the machine (client and Redis alike), and 4 processes make strict calls on one tree in a
tight loop for ``seconds`` (default 10) per rule:

- ``evidence`` (the coordinator's rule): a reserve that got no answer within the hot-path
  timeout is sent once more; a node opens only after ``TIMEOUTS_TO_OPEN`` calls in a row
  timed out (a refused or reset connection opens it at once);
- ``first timeout`` (the rule before): no second send, the first timeout opens the
  breaker for at least one probe interval.

Prints, per rule: calls, refused calls (the target is 0), and the decision time (median,
99th percentile, max).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from short_run import parse  # bench/short_run.py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coordinator import ExecutionConfig, ExecutionContext  # noqa: E402
from coordinator.embedded import RedisServer  # noqa: E402
from tests.support.procs import TEST_KEYS  # noqa: E402

SPAWN = mp.get_context("spawn")
BIG = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**9)


def burn(stop: Any) -> None:
    """Keep one CPU busy until ``stop`` is set."""
    while not stop.is_set():
        for _ in range(100_000):
            pass


def agent(url: str, token: str, rule: str, seconds: float, out: Any) -> None:
    """Strict calls in a tight loop; report the decisions and their times."""
    from coordinator import Coordinator, Decision, WrapOptions
    from coordinator.context.state import ContextState
    from coordinator.runtime import backend_health

    if rule == "first timeout":
        backend_health.TIMEOUTS_TO_OPEN = 1
        ContextState.has_time_to_resend = lambda self: False  # type: ignore[method-assign]
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    opts = WrapOptions(cost_estimate_hint=0.0001)
    times, refused = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        d = ctx.wrap_llm_call(lambda: None, opts)
        times.append(time.perf_counter() - start)
        refused += d != Decision.ALLOW
    coord.close()
    out.put((len(times), refused, times))


def run(url: str, token: str, rule: str, seconds: float, agents: int) -> None:
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=agent, args=(url, token, rule, seconds, out))
             for _ in range(agents)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    calls = sum(r[0] for r in results)
    refused = sum(r[1] for r in results)
    times = sorted(t for r in results for t in r[2])
    p99 = times[int(len(times) * 0.99)] if times else 0.0
    print(f"{rule:>14}: {calls:7d} calls, {refused:6d} refused "
          f"({100 * refused / max(calls, 1):.2f}%), decision median "
          f"{statistics.median(times) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
          f"max {times[-1] * 1e3:.0f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seconds", type=float, nargs="?", default=10.0)
    ap.add_argument("per_cpu", type=int, nargs="?", default=3)
    ap.add_argument("--agents", type=int, default=4, help="processes making calls")
    args = parse(ap, seconds=1.0, per_cpu=0, agents=1)
    seconds, per_cpu = args.seconds, args.per_cpu
    with RedisServer() as server:
        from coordinator import Coordinator

        coord = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
        root = ExecutionContext(BIG, coordinator=coord)
        stop = SPAWN.Event()
        burners = [SPAWN.Process(target=burn, args=(stop,))
                   for _ in range(per_cpu * (os.cpu_count() or 1))]
        for b in burners:
            b.start()
        print(f"{len(burners)} busy processes on {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.1f}; {args.agents} processes calling for {seconds:g} s "
              "per rule", flush=True)
        try:
            for rule in ("evidence", "first timeout"):
                run(server.url, root.token, rule, seconds, args.agents)
        finally:
            stop.set()
            for b in burners:
                b.join(10)
        print(f"load at the end {os.getloadavg()[0]:.1f}")
        root.close()
        coord.close()


if __name__ == "__main__":
    main()
