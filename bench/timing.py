"""Timing shared by the benchmarks (imported from the bench/ folder they run in)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import redis


def sample_us(variants: dict[str, Callable[[], object]], n: int,
              between: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """n timings (µs) of each variant, interleaved call by call, so machine drift and load
    from other processes hit every variant alike. The order changes every round (seeded):
    a call runs slower right after some others (another socket, cold caches), and no
    variant should always be the one that follows.

    ``between`` runs untimed after every call: pass the store's flush so that the
    write-behind settle a call leaves to Redis is finished before the next call starts.
    Otherwise it would delay whichever variant comes next (the settle of one variant
    would be charged to another); its Redis time is measured by :func:`server_us`."""
    out: dict[str, list[float]] = {k: [] for k in variants}
    clock = time.perf_counter
    order = list(variants.items())
    shuffle = random.Random(0).shuffle
    for _ in range(n):
        shuffle(order)
        for name, fn in order:
            start = clock()
            fn()
            out[name].append((clock() - start) * 1e6)
            if between is not None:
                between()
    return out


def back_to_back_us(variants: dict[str, Callable[[], object]], n: int, block: int = 50
                    ) -> dict[str, list[float]]:
    """n timings (µs) of each variant run in blocks of ``block`` calls in a row (blocks
    interleaved): each call also waits for whatever write-behind work the call before it,
    of the same variant, left to Redis. The pessimistic view: no time between calls."""
    out: dict[str, list[float]] = {k: [] for k in variants}
    clock = time.perf_counter
    for _ in range(max(1, n // block)):
        for name, fn in variants.items():
            for _ in range(block):
                start = clock()
                fn()
                out[name].append((clock() - start) * 1e6)
    return out


def server_us(client: redis.Redis, fn: Callable[[], object], n: int,
              between: Callable[[], object] | None = None) -> float:
    """CPU time (µs) of the Redis server's main thread per call of ``fn`` over ``n`` calls
    (INFO cpu: scripts, commands and their network I/O), write-behind work included."""
    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_user_main_thread"]) + float(
            info["used_cpu_sys_main_thread"])

    if between is not None:
        between()
    before = cpu()
    for _ in range(n):
        fn()
    if between is not None:
        between()
    return (cpu() - before) * 1e6 / n


def median_ratio_interval(num: list[float], den: list[float], *, resamples: int = 1000,
                          seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of ``median(num) / median(den)``: how far this run's
    sampling alone could move the ratio. Drift between runs on a shared machine is not in
    it (compare runs for that)."""
    rng = random.Random(seed)
    median = statistics.median
    ratios = sorted(median(rng.choices(num, k=len(num))) / median(rng.choices(den, k=len(den)))
                    for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]
