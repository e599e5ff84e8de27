"""Per-call overhead of a wrapped call, in raw Redis round trips.

Everything is measured in one process against one loopback redis-server started here,
interleaved call by call (raw, depth1, depth8, tokens, raw, ...) so that machine drift and
load from other processes hit every variant alike; figures are per-call medians:

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

from timing import sample_us  # bench/timing.py

from coordinator import (
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
)
from coordinator.embedded import RedisServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()

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
            "depth1": lambda: root.wrap_llm_call(_noop),
            "depth8": lambda: deep.wrap_llm_call(_noop),
            "tokens": lambda: tok_root.wrap_llm_call(_noop, tok_opts),
        }
        sample_us(variants, 300)  # warm up
        samples = sample_us(variants, args.calls)
        med = {k: statistics.median(v) for k, v in samples.items()}
        coord.close()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server on loopback; "
          f"{args.calls} interleaved calls of each, per-call medians")
    for name, us in med.items():
        print(f"  {name:7s} {us:8.1f} us/call   {us / med['raw']:5.2f} round trips")
    print(f"  depth8 / depth1 = {med['depth8'] / med['depth1']:.2f}   (target <= 1.2)")
    print(f"  depth1 / raw    = {med['depth1'] / med['raw']:.2f}   (target <= 1.5)")
    print(f"  tokens / depth1 = {med['tokens'] / med['depth1']:.2f}   (target <= 1.1)")


def _noop() -> None:
    return None


if __name__ == "__main__":
    main()
