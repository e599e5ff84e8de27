"""Async callers and a stalling Redis, side by side in one run.

1. 200 concurrent ``awrap_llm_call`` around a 200 ms sleep, on loopback and through a
   local proxy adding 1 ms to every round trip (bench/latency_proxy.py, a child process),
   rounds interleaved: the wall time against 200 ms + one round trip, and the largest
   event-loop lag a heartbeat coroutine saw.
2. The same load while the redis-server this bench started is paused (SIGSTOP) for 12 s:
   the largest event-loop lag, how long each call started in the stall took to be
   decided, and how long after SIGCONT calls were allowed again (vs the probe interval).

Run: .venv/bin/python bench/bench_async.py [--rounds 5] [--stall-s 12]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field

from latency_proxy import LatencyProxy
from short_run import parse  # bench/short_run.py

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.embedded import RedisServer, free_port
from coordinator.runtime.settings import DEFAULT_HOT_TIMEOUT_MS, DEFAULT_PROBE_INTERVAL_MS

CONCURRENCY = 200
SLEEP_S = 0.2
KEYS = {"bench": b"bench-key-0123456789abcdef"}
CONFIG = ExecutionConfig(max_cost_usd=10_000.0, max_steps=10_000_000,
                         max_retries_total=1000)
OPTS = WrapOptions(cost_estimate_hint=0.001)


class Heartbeat:
    """Wakes every ``period_s``; records (time, lateness) of every beat."""

    def __init__(self, period_s: float = 0.002) -> None:
        self.period_s = period_s
        self.beats: list[tuple[float, float]] = []
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            start = time.monotonic()
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            self.beats.append((now, now - start - self.period_s))

    def stop(self) -> None:
        self._stop = True

    def worst(self, since: float = 0.0, until: float = float("inf")) -> float:
        return max((lag for t, lag in self.beats if since <= t <= until), default=0.0)


def rtt_ms(coord: Coordinator, n: int = 200) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        coord.client.ping()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def one_round(ctx: ExecutionContext) -> tuple[float, float]:
    beat = Heartbeat()
    beating = asyncio.create_task(beat.run())
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    got = await asyncio.gather(*(ctx.awrap_llm_call(lambda: asyncio.sleep(SLEEP_S), OPTS)
                                 for _ in range(CONCURRENCY)))
    wall = time.perf_counter() - start
    beat.stop()
    await beating
    assert all(d == Decision.ALLOW for d in got), got
    return wall, beat.worst()


async def concurrency(urls: dict[str, str], rounds: int) -> dict[str, list[tuple[float, float]]]:
    coords = {k: Coordinator.from_url(u, token_keys=KEYS) for k, u in urls.items()}
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in urls}
    try:
        ctxs = {k: ExecutionContext(CONFIG, coordinator=c) for k, c in coords.items()}
        for ctx in ctxs.values():
            await ctx.__aenter__()
            await one_round(ctx)  # warm up: connections, scripts, threads
        for _ in range(rounds):
            for k, ctx in ctxs.items():
                out[k].append(await one_round(ctx))
        for ctx in ctxs.values():
            await ctx.aclose()
    finally:
        for c in coords.values():
            c.close()
    return out


@dataclass
class StallRun:
    stopped_at: float = 0.0
    resumed_at: float = 0.0
    calls: list[tuple[float, float, Decision]] = field(default_factory=list)
    bodies: list[float] = field(default_factory=list)
    beat: Heartbeat = field(default_factory=Heartbeat)
    gc_pauses: list[float] = field(default_factory=list)


async def stall(server: RedisServer, stall_s: float) -> StallRun:
    run = StallRun()
    coord = Coordinator.from_url(server.url, token_keys=KEYS)
    assert server.proc is not None
    pid = server.proc.pid

    def pause() -> None:
        time.sleep(1.5)
        os.kill(pid, signal.SIGSTOP)
        run.stopped_at = time.monotonic()
        time.sleep(stall_s)
        os.kill(pid, signal.SIGCONT)
        run.resumed_at = time.monotonic()

    gc_started = [0.0]

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            run.gc_pauses.append(time.perf_counter() - gc_started[0])

    gc.callbacks.append(gc_timer)

    async def body() -> None:
        run.bodies.append(time.monotonic())
        await asyncio.sleep(SLEEP_S)

    async def agent(ctx: ExecutionContext, end: float) -> None:
        while time.monotonic() < end:
            start = time.monotonic()
            decision = await ctx.awrap_llm_call(body, OPTS)
            run.calls.append((start, time.monotonic(), decision))
            if decision != Decision.ALLOW:
                await asyncio.sleep(0.05)  # an agent backs off a refused call

    try:
        async with ExecutionContext(CONFIG, coordinator=coord) as ctx:
            await ctx.awrap_llm_call(lambda: asyncio.sleep(0), OPTS)
            beating = asyncio.create_task(run.beat.run())
            threading.Thread(target=pause, daemon=True).start()
            end = time.monotonic() + 1.5 + stall_s + 2.0
            await asyncio.gather(*(agent(ctx, end) for _ in range(CONCURRENCY)))
            run.beat.stop()
            await beating
    finally:
        gc.callbacks.remove(gc_timer)
        coord.close()
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stall-s", type=float, default=12.0)
    args = parse(parser, rounds=1, stall_s=1.0)
    print(f"machine: {platform.platform()}, {platform.python_version()}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    with RedisServer() as server, LatencyProxy(free_port(), server.port, 1.0) as proxy:
        urls = {"loopback": server.url, "proxy +1 ms": f"redis://127.0.0.1:{proxy.port}/0"}
        rtts = {}
        for k, u in urls.items():
            c = Coordinator.from_url(u, token_keys=KEYS)
            rtts[k] = rtt_ms(c)
            c.client.close()
        res = asyncio.run(concurrency(urls, args.rounds))
        print(f"\n{CONCURRENCY} concurrent awrap_llm_call around a {SLEEP_S * 1000:.0f} ms "
              f"sleep, {args.rounds} rounds interleaved (median [max]):")
        print(f"{'':14}{'RTT ms':>8}{'wall ms':>16}{'target ms':>11}{'ratio':>8}"
              f"{'loop lag ms':>18}")
        for k, rows in res.items():
            walls = [w * 1000 for w, _ in rows]
            lags = [lag * 1000 for _, lag in rows]
            target = SLEEP_S * 1000 + rtts[k]
            print(f"{k:14}{rtts[k]:8.2f}{statistics.median(walls):9.1f} [{max(walls):5.1f}]"
                  f"{target:11.1f}{statistics.median(walls) / target:8.3f}"
                  f"{statistics.median(lags):10.1f} [{max(lags):5.1f}]")
    with RedisServer() as server:
        run = asyncio.run(stall(server, args.stall_s))
    hot, probe = DEFAULT_HOT_TIMEOUT_MS, DEFAULT_PROBE_INTERVAL_MS
    in_stall = [(s, e, d) for s, e, d in run.calls if run.stopped_at <= s < run.resumed_at]
    waits = sorted((e - s) * 1000 for s, e, _ in in_stall)
    undecided = [1 for s, e, _ in in_stall if e - s > (hot + 50) / 1000]
    halts = sum(d == Decision.HALT for _, _, d in in_stall)
    ran = [t for t in run.bodies if run.stopped_at + 0.05 < t < run.resumed_at]
    back = min((t for t in run.bodies if t >= run.resumed_at), default=float("nan"))
    print(f"\nRedis paused {args.stall_s:.0f} s under the same load (hot-path timeout "
          f"{hot} ms, probe interval {probe} ms):")
    print(f"  largest event-loop lag: during the stall "
          f"{run.beat.worst(run.stopped_at, run.resumed_at) * 1000:.1f} ms, whole run "
          f"{run.beat.worst() * 1000:.1f} ms")
    print(f"  calls started in the stall: {len(in_stall)}, HALT {halts}, bodies run "
          f"{len(ran)}; decided in median {statistics.median(waits):.2f} ms, p99 "
          f"{waits[int(len(waits) * 0.99)]:.1f} ms, max {waits[-1]:.1f} ms; over "
          f"{hot}+50 ms: {len(undecided)}")
    top = sorted(((lag, t) for t, lag in run.beat.beats), reverse=True)[:5]
    print(f"  longest garbage-collector pause: {max(run.gc_pauses, default=0) * 1000:.1f} ms")
    print("  largest lags (ms at s after SIGSTOP): " + ", ".join(
        f"{lag * 1000:.0f} at {t - run.stopped_at:+.2f}" for lag, t in top))
    print(f"  first call allowed {(back - run.resumed_at) * 1000:.0f} ms after SIGCONT "
          f"(probe interval {probe} ms)")


if __name__ == "__main__":
    main()
