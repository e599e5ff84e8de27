"""Timing shared by the benchmarks (imported from the bench/ folder they run in)."""

from __future__ import annotations

import time
from collections.abc import Callable


def sample_us(variants: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    """n timings (µs) of each variant, interleaved call by call, so machine drift and load
    from other processes hit every variant alike."""
    out: dict[str, list[float]] = {k: [] for k in variants}
    clock = time.perf_counter
    for _ in range(n):
        for name, fn in variants.items():
            start = clock()
            fn()
            out[name].append((clock() - start) * 1e6)
    return out
