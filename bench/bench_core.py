"""Per-call overhead of a wrapped call, in raw Redis round trips.

Everything is measured in one process against one loopback redis-server started here,
interleaved call by call in a new order every round, so that machine drift and load from
other processes hit every variant alike; figures are per-call medians of the time the
caller waits. A call's settle is written behind (sent, not waited for): it is drained,
untimed, after every call, so that no variant waits for the settle of the one before it
(with a real LLM call in between, Redis has long finished it). Two more columns show what
that leaves out: "back to back", the same calls in blocks of 50 in a row (each call waits
for its predecessor's settle), and the Redis main thread's CPU time per call (INFO cpu,
write-behind work included). Each ratio comes with its 95 % bootstrap interval (this
run's sampling; drift between runs is larger):

  raw      one EVALSHA of a trivial script (redis-py, hiredis): the unit
  depth1   wrap_llm_call of a no-op in a root context
  depth8   the same at the bottom of an 8-level tree (reserve checks all 8 levels)
  tokens   depth 1 with a TokenBudget with two provider shares and a token estimate

Run: .venv/bin/python bench/bench_core.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from short_run import parse  # bench/short_run.py
from timing import (  # bench/timing.py
    back_to_back_us,
    median_ratio_interval,
    sample_us,
    server_us,
)

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
)
from coordinator.embedded import RedisServer


@dataclass
class CoreFigures:
    """One run's figures: per-call medians (µs) of each variant, interleaved and back to
    back, the Redis CPU per call, and the raw samples (for ratio intervals)."""

    calls: int
    median: dict[str, float]
    back_to_back: dict[str, float]
    server: dict[str, float]
    samples: dict[str, list[float]]

    def ratio(self, a: str, b: str) -> float:
        return self.median[a] / self.median[b]


def measure(calls: int) -> CoreFigures:
    """Run the four variants side by side against a redis-server started here."""
    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys={"b": b"bench-secret-0123456789"})
        big = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
        root = ExecutionContext(big, coordinator=coord)
        deep = root
        for _ in range(7):
            deep = deep.spawn_child()
        shares = TokenBudget(total=10**12, input=10**12, output=10**12, provider_shares={
            "openai": TokenBudget(total=10**12), "anthropic": TokenBudget(total=10**12)})
        tok_root = ExecutionContext(big.model_copy(update={"token_budget": shares}),
                                    coordinator=coord)
        tok_opts = WrapOptions(provider="openai", input_tokens_estimate=500,
                               max_output_tokens=200)
        raw = coord.client.register_script("return 1")
        raw()

        variants: dict[str, Callable[[], object]] = {
            "raw": raw,
            "depth1": lambda: _allowed(root.wrap_llm_call(_noop)),
            "depth8": lambda: _allowed(deep.wrap_llm_call(_noop)),
            "tokens": lambda: _allowed(tok_root.wrap_llm_call(_noop, tok_opts)),
        }
        drain = coord.store.flush
        sample_us(variants, 300, drain)  # warm up
        samples = sample_us(variants, calls, drain)
        med = {k: statistics.median(v) for k, v in samples.items()}
        b2b = {k: statistics.median(v)
               for k, v in back_to_back_us(variants, min(calls, 2000)).items()}
        server_cpu = {k: server_us(coord.client, fn, min(calls, 2000), drain)
                      for k, fn in variants.items()}
        coord.close()
    return CoreFigures(calls, med, b2b, server_cpu, samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    args = parse(ap, calls=30)
    fig = measure(args.calls)
    med, b2b, server = fig.median, fig.back_to_back, fig.server
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server on loopback, load "
          f"{os.getloadavg()[0]:.1f}; {args.calls} interleaved calls of each, per-call medians")
    print(f"  {'':7s} {'us/call':>8s}  {'/ raw':>5s}   {'back to back':>12s}  "
          f"{'Redis CPU us/call':>17s}")
    for name, us in med.items():
        print(f"  {name:7s} {us:8.1f}  {us / med['raw']:5.2f}   {b2b[name]:12.1f}  "
              f"{server[name]:17.1f}")
    for a, b, target in (("depth8", "depth1", 1.2), ("depth1", "raw", 1.5),
                         ("tokens", "depth1", 1.1)):
        low, high = median_ratio_interval(fig.samples[a], fig.samples[b])
        print(f"  {a} / {b}: {med[a] / med[b]:.2f} [{low:.2f}, {high:.2f}] (target <= "
              f"{target})   back to back {b2b[a] / b2b[b]:.2f}   Redis CPU "
              f"{server[a] / server[b]:.2f}")


def _noop() -> None:
    return None


def _allowed(decision: Decision) -> None:
    """A refused call (Redis too slow for the hot-path timeout on an overloaded machine)
    takes no round trip: it would make the figures look better than they are."""
    if decision != Decision.ALLOW:
        raise RuntimeError(f"a call was refused ({decision}): rerun on a calmer machine")


if __name__ == "__main__":
    main()
