"""The books add up under concurrency (issue 25): four processes on one tree run seeded
sequences of valid and invalid reports, unknown models, exceptions and interruptions.
Every run counts exactly one step or one retry, the tree's spend is exactly the sum of
the charging rule over the calls, no ceiling is exceeded (every estimate covers its
actual) and nothing is left held."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from tests.support import books_procs
from tests.support.invariants import check_tree

SPAWN = mp.get_context("spawn")


@pytest.mark.parametrize("seed", [11, 2026])
def test_four_processes_every_run_on_the_books(coord: Coordinator, redis_url: str,
                                               seed: int) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.25, max_steps=10_000,
                                            max_retries_total=10_000), coordinator=coord)
    mids = [root.spawn_child(max_cost_usd=0.15) for _ in range(2)]
    leaves = [m.spawn_child(max_cost_usd=0.09) for m in mids for _ in range(2)]
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=books_procs.books_run,
                             args=(redis_url, leaves[i].token, seed * 10 + i, 60, out))
               for i in range(4)]
    for w in workers:
        w.start()
    results = [out.get(timeout=240) for _ in workers]
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    coord.store.flush()
    runs = sum(r["runs"] for r in results)
    steps = sum(r["steps"] for r in results)
    retries = sum(r["retries"] for r in results)
    assert runs == steps + retries and runs > 40
    h = coord.store.read_hash(root.chain_id, root.chain_id)
    # every run counted exactly one step or one retry, at every level of the tree
    assert (int(h.get("u:steps", 0)), int(h.get("u:retries", 0))) == (steps, retries)
    # the spend is exactly what the rule says, summed over the calls that ran
    assert int(h["u:usd"]) == sum(r["micro"] for r in results)
    # and the counts of call outcomes add up to the runs
    counted = sum(int(v) for k, v in h.items()
                  if k in ("n:ok", "n:error", "n:interrupted", "n:halted"))
    assert counted == runs
    # ceilings hold, nothing is held, each level's ledger equals its calls (invariants.py)
    check_tree(coord.client, root.chain_id)
    assert any(r["halted"] for r in results)  # a ceiling was reached along the way
    root.close()
