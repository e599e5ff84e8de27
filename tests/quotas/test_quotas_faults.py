"""Quotas fail closed: on a 3-primary Redis Cluster, while the primary holding a quota's
keys does not answer, a call that needs a grant from it returns HALT
(``backend_unavailable``) instead of running unbudgeted; when it answers, calls go on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

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
from coordinator.quotas import QuotaRule, Quotas
from tests.support.procs import TEST_KEYS
from tests.support.quota_procs import labelled
from tests.support.topologies import Cluster

KS = KeySpace()
QK = QuotaKeys(KS)
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
CALL = WrapOptions(cost_estimate_hint=0.01)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster() as c:
        yield c


def _spend() -> None:
    report_usage(cost_usd=0.01)


def test_a_call_needing_an_unreachable_quota_fails_closed(cluster: Cluster) -> None:
    cluster.flush()
    coord = Coordinator.from_url(cluster.url, token_keys=TEST_KEYS, hot_timeout_ms=300,
                                 probe_interval_ms=100)
    rule = QuotaRule(id="user-day", match={"user": "*"}, usd=1.0)
    Quotas(coord).set(rule, actor="test")
    client = coord.client
    rule_node = client.get_node_from_key(QK.rule(rule.id)).name
    ctx = ExecutionContext(CONFIG, metadata=labelled("ann"), coordinator=coord)
    while client.get_node_from_key(KS.ctx(ctx.chain_id, ctx.chain_id)).name == rule_node:
        ctx.close()
        ctx = ExecutionContext(CONFIG, metadata=labelled("ann"), coordinator=coord)
    coord.store.flush()  # the root's buckets are named
    node = next(n for n in cluster.nodes if rule_node.endswith(f":{n.port}"))
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        refused = run_sync(ctx._state, ctx, "llm", _spend, CALL)
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    assert refused.decision == Decision.HALT
    assert refused.reason == "backend_unavailable"
    assert int(client.hget(KS.ctx(ctx.chain_id, ctx.chain_id), "u:usd") or 0) == 0
    deadline = time.monotonic() + 10
    decision = Decision.HALT
    while decision != Decision.ALLOW and time.monotonic() < deadline:
        time.sleep(0.2)
        decision = ctx.wrap_llm_call(_spend, CALL)
    assert decision == Decision.ALLOW  # the quota answers again: calls go on
    ctx.close()
    window = next(iter(Quotas(coord).status(rule)))
    assert window.spent["usd"] == 10_000 and window.in_grants["usd"] == 0
    coord.close()
