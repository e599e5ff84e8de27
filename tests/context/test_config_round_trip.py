"""A config given is a config kept: what a process that attaches reads back from Redis is
what the opener gave, including a lease policy equal to the defaults (the README's)."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    report_usage,
)
from coordinator.core.plans import open_plan
from coordinator.core.snapshots import config_from_hash
from tests.support.invariants import check_tree
from tests.support.procs import _coord

SPAWN = mp.get_context("spawn")
CALLS = 200
README_POLICY = LeasePolicy(usd=0.05, steps=100, max_age_ms=2000)  # the defaults' values


def _config(lease: LeasePolicy | None) -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=10.0, max_steps=100_000, max_retries_total=10,
                           lease=lease)


def _stored(config: ExecutionConfig) -> dict[str, str]:
    """The hash fields config_from_hash reads, as an open with ``config`` writes them."""
    return {"l:usd": "10000000", "l:steps": "100000", "l:retries": "10",
            "config": open_plan(config, is_child=False).config_json}


@pytest.mark.parametrize("lease", [None, LeasePolicy(), README_POLICY,
                                   LeasePolicy(usd=0.2, tokens=500, return_on_expiry=True)])
def test_the_lease_policy_reads_back_as_given(lease: LeasePolicy | None) -> None:
    assert config_from_hash(_stored(_config(lease))).lease == lease


@pytest.mark.parametrize(("stored", "lease"), [
    ('{}', None),  # no lease policy
    ('{"timeout_ms":5000}', None),
    ('{"lease":{}}', LeasePolicy()),  # a policy with the defaults' values
    ('{"lease":{"usd":0.1}}', LeasePolicy(usd=0.1)),
])
def test_stored_configs_read_back(stored: str, lease: LeasePolicy | None) -> None:
    h = {"l:usd": "1000000", "l:steps": "5", "l:retries": "1", "config": stored}
    assert config_from_hash(h).lease == lease


def calls_in_attached_process(url: str, token: str, out: Any) -> None:
    """Attach the token's context, make CALLS small calls, close the handle; report the
    lease policy read back and the EVALSHA commands the server ran meanwhile."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    before = _evalsha(coord.client)
    opts = WrapOptions(cost_estimate_hint=0.0001)
    decisions = [ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.0001), opts)
                 for _ in range(CALLS)]
    ctx.close()
    out.put({"lease": None if ctx.config.lease is None else ctx.config.lease.model_dump(),
             "allowed": decisions.count(Decision.ALLOW),
             "evalsha": _evalsha(coord.client) - before})
    coord.close()


def _evalsha(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_process_that_attaches_serves_calls_from_the_readmes_lease(
        coord: Coordinator, redis_url: str) -> None:
    root = ExecutionContext(_config(README_POLICY))
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=calls_in_attached_process, args=(redis_url, root.token, out))
    proc.start()
    report = out.get(timeout=120)
    proc.join(60)
    assert proc.exitcode == 0
    assert report["lease"] == README_POLICY.model_dump()
    assert report["allowed"] == CALLS
    # lease mode: a slice per 100 steps and batched flushes; strict mode would run two
    # scripts per call (reserve, settle)
    assert report["evalsha"] / CALLS < 0.5, report
    root.close()
    assert check_tree(coord.client, root.chain_id) == CALLS * 100
