"""The dashboard's overview with many open trees: server time and Redis commands per
request of a page of 50 (sorted by spend, filtered by a label, a deep page, the newest of
all trees), side by side with /healthz in the same run, at 1,000 and 10,000 open trees.

    .venv/bin/python bench/bench_dashboard.py [--trees 1000,10000] [--requests 200]

Server time is measured inside the server process around the ASGI app (from the request
to the last byte of the response); Redis commands are counted with INFO commandstats
(the background threads and the read cache are off, so every request reads Redis).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
import uvicorn
from short_run import parse  # bench/short_run.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator import (  # noqa: E402
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.dashboard import create_app  # noqa: E402
from coordinator.dashboard.indexer import Indexer  # noqa: E402
from coordinator.embedded import RedisServer, free_port  # noqa: E402
from coordinator.store.dashboard_index import DashboardIndex  # noqa: E402

KEYS = {"bench": b"bench-secret-0123456789abcdef"}


class Timed:
    """ASGI wrapper recording each request's server time (µs) by path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.times: dict[str, list[float]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        await self.app(scope, receive, send)
        key = scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"]
                               else "")
        self.times.setdefault(key, []).append((time.perf_counter() - start) * 1e6)


def seed(url: str, n: int, start: int) -> None:
    """Open ``n`` trees with one call each, left open (in another process, so that the
    server's process does not carry their handles)."""
    coord = Coordinator.from_url(url, token_keys=KEYS)
    rng = random.Random(start)
    trees = []
    for i in range(start, start + n):
        ctx = ExecutionContext(
            ExecutionConfig(max_cost_usd=10.0, max_steps=1000, max_retries_total=5),
            metadata=ChainMetadata(request_id=f"r{i}", chain_id=f"tree-{i:05d}",
                                   org_id=f"org{i % 7}", team=f"team{i % 20}",
                                   service=f"svc{i % 13}"),
            coordinator=coord)
        usd = round(rng.uniform(0.001, 9.0), 6)
        ctx.wrap_llm_call(lambda usd=usd: report_usage(cost_usd=usd, input_tokens=100,
                                                       output_tokens=20, provider="openai"),
                          WrapOptions(cost_estimate_hint=usd))
        trees.append(ctx)
    coord.close()


def commands(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def measure(base: str, timed: Timed, client: redis.Redis, paths: list[str], n: int
            ) -> dict[str, tuple[float, float]]:
    """p50 server µs and Redis commands per request, requests interleaved."""
    per: dict[str, list[int]] = {p: [] for p in paths}
    order = list(paths)
    shuffle = random.Random(0).shuffle
    for p in paths:
        timed.times.pop(p, None)
    for _ in range(n):
        shuffle(order)
        for p in order:
            before = commands(client)
            with urllib.request.urlopen(base + p) as resp:
                resp.read()
            per[p].append(commands(client) - before - 1)  # minus the INFO itself
    return {p: (statistics.median(timed.times[p]), statistics.mean(per[p])) for p in paths}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", default="1000,10000")
    parser.add_argument("--requests", type=int, default=200)
    args = parse(parser, trees="20", requests=3)
    sizes = [int(x) for x in args.trees.split(",")]
    with RedisServer() as server:
        coord = Coordinator.from_url(server.url, token_keys=KEYS)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        app = create_app(coord, background=False, cache_s=0.0)
        timed = Timed(app)
        port = free_port()
        config = uvicorn.Config(timed, host="127.0.0.1", port=port, log_level="warning",
                                lifespan="on")
        web = uvicorn.Server(config)
        thread = threading.Thread(target=web.run, daemon=True)
        thread.start()
        while not web.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        indexer = Indexer(DashboardIndex(coord.client, coord.keyspace))
        paths = ["/healthz", "/api/trees?sort=spend&size=50",
                 "/api/trees?sort=fraction&size=50&label=team%3Dteam3",
                 "/api/trees?sort=spend&size=50&page=150", "/api/trees?sort=age&size=50",
                 "/?sort=spend&size=50"]
        seeded_n = 0
        print(f"{'open trees':>10}  {'request':<52} {'p50 server ms':>13} "
              f"{'/ healthz':>9} {'Redis cmds':>10}")
        for size in sizes:
            t0 = time.perf_counter()
            proc = multiprocessing.get_context("spawn").Process(
                target=seed, args=(server.url, size - seeded_n, seeded_n))
            proc.start()
            proc.join()
            seeded_n = size
            seeded = time.perf_counter() - t0
            before = commands(client)
            t0 = time.perf_counter()
            indexer.sweep()
            sweep_s = time.perf_counter() - t0
            sweep_cmds = commands(client) - before
            before = commands(client)
            t0 = time.perf_counter()
            indexer.sweep()  # nothing changed: reads only
            idle_s = time.perf_counter() - t0
            idle_cmds = commands(client) - before
            results = measure(base, timed, client, paths, args.requests)
            health = results["/healthz"][0]
            for p, (us, cmds) in results.items():
                print(f"{size:>10}  {p:<52} {us / 1000:>13.2f} {us / health:>9.1f} "
                      f"{cmds:>10.1f}")
            print(f"{size:>10}  (seeded in {seeded:.1f} s; indexer full pass: first "
                  f"{sweep_s * 1000:.0f} ms / {sweep_cmds} commands, unchanged "
                  f"{idle_s * 1000:.0f} ms / {idle_cmds} commands)")
        web.should_exit = True
        thread.join(10)
        coord.close()
        client.close()


if __name__ == "__main__":
    main()
