"""Start several spawned processes on one body and release them together."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

SPAWN = mp.get_context("spawn")


def run_together(target: Callable[..., None], args: tuple[Any, ...], n: int = 4,
                 timeout_s: float = 120) -> list[Any]:
    """Run ``target(*args, start, out)`` in ``n`` processes: each waits for ``start``
    (set once all are started) and puts its result on ``out``. Returns the results (in
    the order they came) once every process exited cleanly."""
    start, out = SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, start, out)) for _ in range(n)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=timeout_s) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, f"a process of {target.__name__} exited {p.exitcode}"
    return results
