"""What a model ladder and a final reserve cost a wrapped call (issue 31, docs/degrade.md).

A wrapped no-op LLM call naming gpt-4o (input_tokens_estimate and max_output_tokens
given, so each rung's worst case is priced) in a context with a two-rung ladder
({"gpt-4o": ["gpt-4o-mini"]}, below=0.2) and a final reserve, against the same call in a
context with neither; in strict mode (the choice rides reserve.lua) and in lease mode (a
slice serves both; the rung is chosen in-process). The budget is large enough that no
call is refused or degraded: the figures are the cost of the terms alone. Everything runs
in one process against one loopback redis-server started here, the four variants
interleaved call by call in a new order every round (bench/timing.py sample_us), the
write-behind drained untimed after each call; per-call medians, and each ratio with its
95 % bootstrap interval (this run's sampling).

Run: .venv/bin/python bench/bench_degrade.py [--calls 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable

from short_run import parse  # bench/short_run.py
from timing import median_ratio_interval, sample_us  # bench/timing.py

from coordinator import (
    Coordinator,
    Decision,
    Degrade,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    current_call,
)
from coordinator.embedded import RedisServer

OPTIONS = WrapOptions(model="gpt-4o", provider="openai", input_tokens_estimate=500,
                      max_output_tokens=200)
LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.2)
LEASE = LeasePolicy(usd=100.0, steps=10**6, tokens=10**9, max_age_ms=30_000)
PAIRS = (("strict_edge", "strict_plain"), ("lease_edge", "lease_plain"))
TARGET = 1.05


def measure(calls: int) -> dict[str, list[float]]:
    """Per-call timings (µs) of the four variants, interleaved."""
    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys={"b": b"bench-secret-0123456789"})
        plain = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
        edge = plain.model_copy(update={"degrade": LADDER, "final_reserve_usd": 1.0})
        roots = {
            "strict_plain": ExecutionContext(plain, coordinator=coord),
            "strict_edge": ExecutionContext(edge, coordinator=coord),
            "lease_plain": ExecutionContext(plain.model_copy(update={"lease": LEASE}),
                                            coordinator=coord),
            "lease_edge": ExecutionContext(edge.model_copy(update={"lease": LEASE}),
                                           coordinator=coord),
        }
        variants: dict[str, Callable[[], object]] = {
            name: _call(root) for name, root in roots.items()}
        drain = coord.store.flush
        sample_us(variants, 300, drain)  # warm up (and take the slices)
        samples = sample_us(variants, calls, drain)
        for root in roots.values():
            root.close()
        coord.close()
    return samples


def _call(root: ExecutionContext) -> Callable[[], None]:
    def run() -> None:
        decision = root.wrap_llm_call(_on_gpt4o, OPTIONS)
        if decision != Decision.ALLOW:
            raise RuntimeError(f"a call was refused ({decision}): rerun on a calmer machine")
    return run


def _on_gpt4o() -> None:
    """The wrapped no-op; a degraded call would make the figures meaningless."""
    info = current_call()
    if info is None or info.model != "gpt-4o":
        raise RuntimeError(f"the call ran on {info and info.model}: not the requested model")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = parse(ap, calls=30, rounds=1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server on loopback, load "
          f"{os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.calls} interleaved calls "
          f"of each, per-call medians (us) and ratios [95 % interval]")
    ratios: dict[str, list[float]] = {a: [] for a, _ in PAIRS}
    for r in range(args.rounds):
        samples = measure(args.calls)
        med = {k: statistics.median(v) for k, v in samples.items()}
        line = "  ".join(f"{k} {v:.1f}" for k, v in med.items())
        print(f"  round {r + 1}: {line}")
        for a, b in PAIRS:
            low, high = median_ratio_interval(samples[a], samples[b])
            ratios[a].append(med[a] / med[b])
            print(f"    {a} / {b}: {med[a] / med[b]:.3f} [{low:.3f}, {high:.3f}]")
    for a, b in PAIRS:
        print(f"  {a} / {b}, median of {args.rounds} rounds: "
              f"{statistics.median(ratios[a]):.3f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
