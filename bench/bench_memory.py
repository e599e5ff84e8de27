"""Redis memory a tree costs: per call after many calls on one tree (strict and lease
mode), and per idle context (opened, no call) and per closed one.

Each figure is measured in its own database of one redis-server started here, two ways
side by side: the growth of ``INFO memory`` ``used_memory`` over the run (everything Redis
allocated, its overheads included), and the sum of ``MEMORY USAGE`` over the tree's keys
(shown per key, so the key that grows is named):

  strict   20,000 wrapped no-op calls on one root (one reserve and settle each)
  lease    20,000 the same in lease mode (served from slices, spend flushed in batches)
  idle     200 children of one root, opened, no call
  called   200 children with one call each, left open (its node record kept)
  closed   200 children with one call each, then closed (their summary event written)

Targets (issue 24): strict <= 500 B/call, lease <= 300 B/call, idle <= 2 KB/context.

``--hash-max-listpack-value 512`` starts the server with deploy/redis.conf's setting (a
context's hash then stays a listpack; the server's default, 64, makes it a hash table).

Run: .venv/bin/python bench/bench_memory.py [--calls 20000] [--contexts 200]
     [--hash-max-listpack-value 512]
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable

from short_run import parse  # bench/short_run.py

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, LeasePolicy
from coordinator.embedded import RedisServer

TARGETS = {"strict": 500, "lease": 300, "idle": 2048, "called": 2048, "closed": 2048}
BIG = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
KEYS = {"b": b"bench-secret-0123456789"}


def used_memory(coord: Coordinator) -> int:
    return int(coord.client.info("memory")["used_memory"])


def key_usage(coord: Coordinator) -> dict[str, int]:
    """MEMORY USAGE of every key, by key shape (ids replaced by <id>)."""
    by_shape: dict[str, int] = {}
    for key in coord.client.scan_iter(count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        size = coord.client.memory_usage(name, samples=0) or 0
        shape = re.sub(r"\{[^}]*\}", "{R}", name)
        shape = re.sub(r":[0-9a-f]{32}$", ":<id>", shape)
        by_shape[shape] = by_shape.get(shape, 0) + size
    return by_shape


def measure(url: str, db: int, run: Callable[[Coordinator], int]
            ) -> tuple[float, float, dict[str, int]]:
    """(used_memory growth, MEMORY USAGE sum, per key shape), each per unit ``run``
    returned."""
    coord = Coordinator.from_url(f"{url.rsplit('/', 1)[0]}/{db}", token_keys=KEYS)
    coord.client.flushdb()
    coord.store.flush()
    before = used_memory(coord)
    units = run(coord)
    coord.store.flush()
    grown = used_memory(coord) - before
    shapes = key_usage(coord)
    coord.close()
    return grown / units, sum(shapes.values()) / units, shapes


def strict_calls(n: int) -> Callable[[Coordinator], int]:
    def run(coord: Coordinator) -> int:
        with ExecutionContext(BIG, coordinator=coord) as root:
            for _ in range(n):
                root.wrap_llm_call(_noop)
            coord.store.flush()
            # open until here: what a running tree holds (its close sets expiries only)
        return n
    return run


def lease_calls(n: int) -> Callable[[Coordinator], int]:
    def run(coord: Coordinator) -> int:
        config = BIG.model_copy(update={"lease": LeasePolicy(usd=1.0, steps=500)})
        with ExecutionContext(config, coordinator=coord) as root:
            for _ in range(n):
                root.wrap_llm_call(_noop)
        return n
    return run


def contexts(n: int, *, call: bool, close: bool) -> Callable[[Coordinator], int]:
    def run(coord: Coordinator) -> int:
        root = ExecutionContext(BIG, coordinator=coord)
        kids = [root.spawn_child() for _ in range(n)]
        if call:
            for kid in kids:
                kid.wrap_llm_call(_noop)
        if close:
            for kid in kids:
                kid.close()
        coord.store.flush()
        return n
    return run


def _noop() -> None:
    return None


UNITS = {"strict": "call", "lease": "call", "idle": "context", "called": "context",
         "closed": "context"}


def measure_all(calls: int, n_contexts: int, listpack_value: int = 0
                ) -> dict[str, tuple[float, float, dict[str, int]]]:
    """Every figure, each in its own database of one redis-server started here (with
    ``hash-max-listpack-value`` set when ``listpack_value`` is not 0)."""
    runs: dict[str, Callable[[Coordinator], int]] = {
        "strict": strict_calls(calls),
        "lease": lease_calls(calls),
        "idle": contexts(n_contexts, call=False, close=False),
        "called": contexts(n_contexts, call=True, close=False),
        "closed": contexts(n_contexts, call=True, close=True),
    }
    extra = ("--hash-max-listpack-value", str(listpack_value)) if listpack_value else ()
    with RedisServer(extra_args=extra) as server:
        return {name: measure(server.url, db, run)
                for db, (name, run) in enumerate(runs.items(), start=1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--contexts", type=int, default=200)
    ap.add_argument("--hash-max-listpack-value", type=int, default=0,
                    help="the server's hash-max-listpack-value (0: its default, 64)")
    args = parse(ap, calls=200, contexts=10)
    results = measure_all(args.calls, args.contexts, args.hash_max_listpack_value)
    setting = args.hash_max_listpack_value or "64 (default)"
    print(f"Redis memory per unit (load {os.getloadavg()[0]:.1f}); {args.calls:,} calls, "
          f"{args.contexts} contexts; hash-max-listpack-value {setting}")
    print(f"  {'':7s} {'used_memory':>12s} {'MEMORY USAGE':>13s} {'target':>7s}")
    for name, (grown, usage, _) in results.items():
        unit = UNITS[name][0]
        met = "met" if max(grown, usage) <= TARGETS[name] else "NOT met"
        print(f"  {name:7s} {grown:9.0f} B/{unit} {usage:10.0f} B/{unit} "
              f"{TARGETS[name]:5d} B  {met}")
    for name, (_, _, shapes) in results.items():
        top = sorted(shapes.items(), key=lambda kv: -kv[1])[:6]
        print(f"  {name}: " + ", ".join(f"{k} {v:,}" for k, v in top))


if __name__ == "__main__":
    main()
