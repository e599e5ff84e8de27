"""Context data: Redis round trips (and time) of ``get`` and ``set`` by depth.

One process, one loopback redis-server started here. Round trips are counted on the
client (every socket write of a command batch that the caller then waits for: a counting
wrapper around redis-py's ``Connection.send_packed_command``), EVALSHA calls on the
server (``INFO commandstats`` deltas); times are per-call medians (µs), interleaved call
by call in a new order every round (bench/timing.py), with their ratio to a raw GET:

  raw GET          one GET of a string key (redis-py, hiredis): the unit
  d1 get own       get of the context's own key, context at depth 1 (a root's child)
  d1 get 1 up      get of a key its parent holds (the most there is at depth 1)
  d2 get 2 up      get of a key two levels up, context at depth 2
  d8 get 2 up      the same, context at depth 8
  d8 get 8 up      a key only the root holds, context at depth 8
  d8 get miss      a key nobody holds: the walk reads all 9 levels
  d1 set, d8 set   set of one key (JSON value), at depth 1 and 8

Run: .venv/bin/python bench/bench_data.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
from collections.abc import Callable
from typing import Any

import redis.connection
from short_run import parse  # bench/short_run.py
from timing import median_ratio_interval, sample_us  # bench/timing.py

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.embedded import RedisServer

_sends = threading.local()


def _counting(original: Callable[..., Any]) -> Callable[..., Any]:
    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        _sends.n = getattr(_sends, "n", 0) + 1
        return original(self, command, check_health)
    return send_packed_command


def round_trips(fn: Callable[[], object], n: int) -> float:
    """Client round trips per call of ``fn`` (this thread's socket writes)."""
    _sends.n = 0
    for _ in range(n):
        fn()
    return float(_sends.n) / n


def evalsha_per_call(client: Any, fn: Callable[[], object], n: int) -> float:
    def calls() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    before = calls()
    for _ in range(n):
        fn()
    return (calls() - before) / n


def chain(root: ExecutionContext, depth: int) -> ExecutionContext:
    ctx = root
    for _ in range(depth):
        ctx = ctx.spawn_child()
    return ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = parse(ap, calls=20)
    conn_cls = redis.connection.AbstractConnection
    conn_cls.send_packed_command = _counting(conn_cls.send_packed_command)  # type: ignore[method-assign]

    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys={"b": b"bench-secret-0123456789"})
        big = ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
        root = ExecutionContext(big, coordinator=coord)
        root.data.set("at_root", {"plan": "p-1", "n": 1})
        d1 = chain(root, 1)
        d1.data.set("own", [1, 2, 3])
        d2 = chain(root, 2)
        d8 = chain(root, 6)
        d8.data.set("two_up", {"user": {"id": 42}})
        d8 = chain(d8, 2)
        coord.client.set("raw", "x" * 20)
        value = {"user": {"id": 42, "email": "u42@example.com"}}
        variants: dict[str, Callable[[], object]] = {
            "raw GET": lambda: coord.client.get("raw"),
            "d1 get own": lambda: d1.data.get("own"),
            "d1 get 1 up": lambda: d1.data.get("at_root"),
            "d2 get 2 up": lambda: d2.data.get("at_root"),
            "d8 get 2 up": lambda: d8.data.get("two_up"),
            "d8 get 8 up": lambda: d8.data.get("at_root"),
            "d8 get miss": lambda: d8.data.get("nobody"),
            "d1 set": lambda: d1.data.set("k", value),
            "d8 set": lambda: d8.data.set("k", value),
        }
        assert d8.data.level_of("two_up") == 2 and d8.data.level_of("at_root") == 8
        assert d2.data.level_of("at_root") == 2 and d1.data.level_of("at_root") == 1
        for fn in variants.values():  # warm up: scripts loaded, connections made
            fn()
        trips = {name: round_trips(fn, 200) for name, fn in variants.items()}
        shas = {name: evalsha_per_call(coord.client, fn, 200) for name, fn in variants.items()}
        times = sample_us(variants, args.calls)
        print(f"# bench_data: {args.calls} calls per variant, python "
              f"{platform.python_version()}, {os.cpu_count()} cpus, redis "
              f"{coord.client.info('server')['redis_version']}")
        print(f"{'variant':<14}{'round trips':>12}{'EVALSHA':>9}{'median µs':>11}"
              f"{'x raw GET':>11}  95 % interval")
        raw = times["raw GET"]
        for name in variants:
            med = statistics.median(times[name])
            lo, hi = median_ratio_interval(times[name], raw)
            print(f"{name:<14}{trips[name]:>12.2f}{shas[name]:>9.2f}{med:>11.1f}"
                  f"{med / statistics.median(raw):>11.2f}  [{lo:.2f}, {hi:.2f}]")
        root.close()
        coord.close()


if __name__ == "__main__":
    main()
