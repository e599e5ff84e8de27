"""Soak with faults: agents in 6 OS processes spend through a 3-level tree for several
seconds while Redis is restarted under them and a subtree is aborted; afterwards every
level's ledger equals the sum of its settled calls, no ceiling is exceeded, and nothing is
left held."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, TokenBudget
from coordinator.embedded import RedisServer
from tests.support import procs
from tests.support.invariants import check_tree

SPAWN = mp.get_context("spawn")


@pytest.mark.slow
def test_soak_with_redis_restart_and_abort() -> None:
    with RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always")) as redis:
        coord = Coordinator.from_url(redis.url, token_keys=procs.TEST_KEYS)
        try:
            root = ExecutionContext(
                ExecutionConfig(max_cost_usd=2.0, max_steps=100_000, max_retries_total=10_000,
                                token_budget=TokenBudget(total=10_000_000)),
                coordinator=coord)
            teams = [root.spawn_child(max_cost_usd=1.2) for _ in range(3)]
            ready, out = SPAWN.Queue(), SPAWN.Queue()
            agents = [SPAWN.Process(target=procs.soak_agent,
                                    args=(redis.url, teams[i % 3].token, i, 6.0, ready, out))
                      for i in range(6)]
            for a in agents:
                a.start()
            for _ in agents:
                ready.get(timeout=120)
            time.sleep(1.5)
            redis.stop()          # Redis goes away under running agents...
            time.sleep(1.0)
            redis.start()         # ...and comes back with its append-only file
            time.sleep(1.0)
            teams[0].abort("soak: team 0 cancelled")
            results = [out.get(timeout=120) for _ in agents]
            for a in agents:
                a.join(30)
                assert a.exitcode == 0
            time.sleep(1.6)       # leases of calls cut by the restart, if any, expire...
            root.wrap_llm_call(lambda: None)  # ...and the next reserve reaps them
            coord.store.flush()
            assert sum(r["allowed"] for r in results) > 100
            assert sum(r["offline"] for r in results) > 0  # the outage was felt
            used = check_tree(coord.client, root.chain_id)
            assert used <= 2_000_000
            assert teams[0].get_snapshot().abort_reason == "aborted"
            for team in teams:
                team.close()
            root.close()
        finally:
            coord.close()
