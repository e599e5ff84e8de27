"""Cost of the shield on a wrapped call, in raw Redis round trips.

One process, one loopback redis-server started here, variants interleaved round by round:

  raw        one EVALSHA of a trivial script (redis-py, hiredis): the unit
  plain      wrap_llm_call of a no-op in a root context (reserve; settle written behind)
  shield     the same with a ShieldPipeline holding one BudgetWindowHook (calls per
             service) and a CircuitBreaker whose check shares the window's round trip
  unshared   the same, the hook not told about the breaker (two round trips before)
  usd        shield, the window also limiting USD, each call's actual cost differing
             from its estimate (the window's charge is one more round trip after the call)

Besides the timing ratio, the round trips each call sends on the caller's thread are
counted exactly (background flushes excluded).

Run: .venv/bin/python bench/bench_shield.py [--calls 3000]

Variants are interleaved call by call, in a new order every round, with each call's
write-behind drained (untimed) before the next; figures are per-call medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
from collections.abc import Callable
from typing import Any

from redis.connection import AbstractConnection
from short_run import parse  # bench/short_run.py
from timing import sample_us  # bench/timing.py

from coordinator import (
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
    WrapOptions,
    report_usage,
)
from coordinator.embedded import RedisServer
from coordinator.shield.breaker import CircuitBreaker
from coordinator.shield.windows import BudgetWindowHook

_sent = {"n": 0}
_send = AbstractConnection.send_packed_command


def _counting_send(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
    # One send_packed_command per round trip (a pipeline packs all its commands in one).
    if threading.current_thread() is threading.main_thread():
        _sent["n"] += 1
    _send(self, command, check_health)


def round_trips(fn: Callable[[], object], n: int = 200) -> float:
    before = _sent["n"]
    for _ in range(n):
        fn()
    return (_sent["n"] - before) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    args = parse(ap, calls=20)
    AbstractConnection.send_packed_command = _counting_send  # type: ignore[method-assign]

    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys={"b": b"bench-secret-0123456789"})
        big = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
        meta = ChainMetadata(request_id="bench", chain_id="plain", service="search")
        many = 10**9

        def shielded(chain_id: str, *, share: bool, max_usd: float | None = None
                     ) -> ExecutionContext:
            breaker = CircuitBreaker(f"openai:{chain_id}", coordinator=coord)
            pipe = ShieldPipeline()
            BudgetWindowHook(scope="service", max_calls=many, max_usd=max_usd, window_s=1.0,
                             name=chain_id, circuit_breaker=breaker if share else None,
                             pipeline=pipe, coordinator=coord)
            return ExecutionContext(big, pipe, meta.model_copy(update={"chain_id": chain_id}),
                                    coordinator=coord, circuit_breaker=breaker)

        plain = ExecutionContext(big, metadata=meta, coordinator=coord)
        shield = shielded("shield", share=True)
        unshared = shielded("unshared", share=False)
        usd = shielded("usd", share=True, max_usd=1e6)
        usd_opts = WrapOptions(cost_estimate_hint=0.002)
        raw = coord.client.register_script("return 1")
        raw()

        def spend() -> None:
            report_usage(cost_usd=0.001)

        variants: dict[str, Callable[[], object]] = {
            "raw": raw,
            "plain": lambda: plain.wrap_llm_call(_noop),
            "shield": lambda: shield.wrap_llm_call(_noop),
            "unshared": lambda: unshared.wrap_llm_call(_noop),
            "usd": lambda: usd.wrap_llm_call(spend, usd_opts),
        }
        drain = coord.store.flush  # each call's write-behind, untimed (see bench/timing.py)
        sample_us(variants, 200, drain)  # warm up
        trips = {name: round_trips(fn) for name, fn in variants.items()}
        samples = sample_us(variants, args.calls, drain)
        med = {k: statistics.median(v) for k, v in samples.items()}
        for ctx in (plain, shield, unshared, usd):
            ctx.close()
        coord.close()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server on loopback; "
          f"{args.calls} interleaved calls of each, per-call medians")
    print(f"  {'variant':9s} {'us/call':>8s}  {'/ raw':>6s}  round trips sent per call")
    for name, us in med.items():
        print(f"  {name:9s} {us:8.1f}  {us / med['raw']:6.2f}  {trips[name]:.2f}")
    extra = (med["shield"] - med["plain"]) / med["raw"]
    print(f"  shield - plain = {extra:.2f} raw round trips of time, "
          f"{trips['shield'] - trips['plain']:.2f} round trips sent   (target <= 1)")


def _noop() -> None:
    return None


if __name__ == "__main__":
    main()
