"""A dead holder's quota grant reclaimed, run for real (docs/quotas.md): the bucket is
charged exactly what the dead tree spent of the grant, never the grant's unspent rest."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.context.wrap import run_sync
from coordinator.core.keys import KeySpace
from coordinator.core.quota_keys import QuotaKeys
from coordinator.quotas import QuotaRule, Quotas, window_at
from tests.support import quota_procs
from tests.support.procs import TEST_KEYS

SPAWN = mp.get_context("spawn")
KS = KeySpace()
QK = QuotaKeys(KS)
CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=10_000, max_retries_total=10)
CALL = WrapOptions(cost_estimate_hint=0.01)


def _spend() -> None:
    report_usage(cost_usd=0.01)


def _bucket(client: Any, rule: QuotaRule, bucket: str, now_ms: int) -> dict[str, int]:
    window = window_at(rule.period, rule.tz, now_ms)
    return {str(k): int(v)
            for k, v in client.hgetall(QK.bucket(rule.id, bucket, window.id)).items()}


def test_a_dead_strict_holder_is_charged_what_it_spent_not_its_grant(
        coord: Coordinator, redis_url: str) -> None:
    rule = QuotaRule(id="key-total", match={"user": "*"}, usd=0.50, period="total")
    Quotas(coord).set(rule, actor="test")
    ready = SPAWN.Queue()
    holder = SPAWN.Process(target=quota_procs.hold_after_calls,
                           args=(redis_url, "ann", 3, ready))
    holder.start()
    dead_root = ready.get(timeout=120)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    granted = int(coord.client.hget(KS.ctx(dead_root, dead_root), "q1:l:usd"))
    assert granted > 30_000  # the dead process held more than it spent
    other = Coordinator.from_url(redis_url, token_keys=TEST_KEYS, lease_ms=1500)
    dead_grant = f"user=ann|total|{dead_root}"
    calls, deadline = 0, time.monotonic() + 60
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=other) as ctx:
        while time.monotonic() < deadline:
            outcome = run_sync(ctx._state, ctx, "llm", _spend, CALL)
            if outcome.decision == Decision.ALLOW:
                calls += 1
            elif not coord.client.hexists(QK.grants(rule.id), dead_grant):
                # refused once the dead grant was reclaimed: the quota is used up
                assert outcome.reason == "quota_exceeded", outcome
                break
            else:  # the dead grant's lease (1.5 s) has not run out yet: a later take
                time.sleep(0.1)  # reclaims it
        fresh_root = ctx.chain_id
    other.close()
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert calls == 47, bucket  # $0.50 less the dead tree's $0.03, not less its grant
    assert int(coord.client.hget(KS.ctx(dead_root, dead_root), "u:usd")) == 30_000
    trees = sum(int(coord.client.hget(KS.ctx(r, r), "u:usd") or 0)
                for r in (dead_root, fresh_root))
    assert bucket["s:usd"] == trees == 500_000
    assert bucket["g:usd"] == 0
