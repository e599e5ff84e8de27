"""What two matching quotas (a team day quota and a per-user day quota) cost a wrapped
call, side by side in one run against one loopback redis-server started here:

  strict        wrap_llm_call of a no-op in a root without quotas (strict mode)
  strict+quota  the same root labelled so that both quotas match (grants drawn)
  lease         a root in lease mode without quotas
  lease+quota   the same in lease mode with both quotas

Calls are interleaved call by call in a new order every round (bench/timing.py), the
write-behind settle drained untimed after each. Then, over --commands calls of each
variant in a row: Redis commands per call (INFO commandstats, the commands scripts run
included) and script calls (EVALSHA) per call.

Run: .venv/bin/python bench/bench_quotas.py [--calls 5000] [--commands 10000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import uuid
from collections.abc import Callable

import redis
from short_run import parse  # bench/short_run.py
from timing import median_ratio_interval, sample_us  # bench/timing.py

from coordinator import (
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
)
from coordinator.embedded import RedisServer
from coordinator.quotas import QuotaRule, Quotas


def _meta(labelled: bool) -> ChainMetadata:
    cid = uuid.uuid4().hex
    if not labelled:
        return ChainMetadata(request_id=cid, chain_id=cid)
    return ChainMetadata(request_id=cid, chain_id=cid, team="research", user_id="ann")


def _commands(client: redis.Redis) -> tuple[int, int]:
    """(every command, EVALSHA) counted by Redis so far."""
    stats = client.info("commandstats")
    total = sum(int(v["calls"]) for v in stats.values())
    return total, int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _per_call(client: redis.Redis, fn: Callable[[], object], n: int,
              drain: Callable[[], None]) -> tuple[float, float]:
    drain()
    before = _commands(client)
    for _ in range(n):
        fn()
    drain()
    after = _commands(client)
    return (after[0] - before[0] - 1) / n, (after[1] - before[1]) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--commands", type=int, default=10_000)
    args = parse(ap, calls=20, commands=100)

    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys={"b": b"bench-secret-0123456789"})
        quotas = Quotas(coord)
        quotas.set(QuotaRule(id="team-day", match={"team": "research"}, usd=1e6), actor="bench")
        quotas.set(QuotaRule(id="user-day", match={"user": "*"}, usd=1e5), actor="bench")
        big = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
        leased = big.model_copy(update={"lease": LeasePolicy(usd=1.0, steps=1000,
                                                               tokens=None, max_age_ms=2000)})
        roots = {
            "strict": ExecutionContext(big, metadata=_meta(False), coordinator=coord),
            "strict+quota": ExecutionContext(big, metadata=_meta(True), coordinator=coord),
            "lease": ExecutionContext(leased, metadata=_meta(False), coordinator=coord),
            "lease+quota": ExecutionContext(leased, metadata=_meta(True), coordinator=coord),
        }
        variants: dict[str, Callable[[], object]] = {
            name: (lambda r=root: r.wrap_llm_call(_noop)) for name, root in roots.items()}
        drain = coord.store.flush
        sample_us(variants, 300, drain)  # warm up (grants taken)
        samples = sample_us(variants, args.calls, drain)
        med = {k: statistics.median(v) for k, v in samples.items()}
        counts = {k: _per_call(coord.client, fn, args.commands, drain)
                  for k, fn in variants.items()}
        for root in roots.values():
            root.close()
        coord.close()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}, Python {platform.python_version()}, redis-server on "
          f"loopback; {args.calls} interleaved calls of each, per-call medians")
    print(f"  {'':13s} {'us/call':>8s}  {'commands/call':>13s}  {'EVALSHA/call':>12s}")
    for name, us in med.items():
        print(f"  {name:13s} {us:8.1f}  {counts[name][0]:13.2f}  {counts[name][1]:12.3f}")
    for a, b, target in (("strict+quota", "strict", 1.15), ("lease+quota", "lease", 1.05)):
        low, high = median_ratio_interval(samples[a], samples[b])
        # a short run of lease mode may send no command at all
        commands = counts[a][0] / counts[b][0] if counts[b][0] else float("nan")
        print(f"  {a} / {b}: {med[a] / med[b]:.3f} [{low:.3f}, {high:.3f}] (target <= "
              f"{target})   commands {commands:.2f}")


def _noop() -> None:
    return None


if __name__ == "__main__":
    main()
