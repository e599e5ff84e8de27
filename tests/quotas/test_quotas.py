"""Quotas (docs/quotas.md), run for real: many processes drawing grants from a team and a
per-user day quota, a fixed window turning, limits changed from another process, a
grant holder SIGKILLed, and everything again on a 3-primary Redis Cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PromptEvaluationError,
    WrapOptions,
    report_usage,
)
from coordinator.context.wrap import run_sync
from coordinator.core.keys import KeySpace
from coordinator.core.quota_keys import QuotaKeys
from coordinator.quotas import QuotaRule, Quotas, window_at
from coordinator.store.quotas_store import NotGranted
from tests.support import quota_procs
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS
from tests.support.topologies import Cluster

SPAWN = mp.get_context("spawn")
KS = KeySpace()
QK = QuotaKeys(KS)
TEAM = QuotaRule(id="team-day", match={"team": "research"}, usd=1.00, period="day")
USER = QuotaRule(id="user-day", match={"team": "research", "user": "*"}, usd=0.40,
                 period="day")
USERS = ("ann", "bob", "cyd")
CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=10_000, max_retries_total=10)
CALL = WrapOptions(cost_estimate_hint=0.01)


def _spend() -> None:
    report_usage(cost_usd=0.01)


def _bucket(client: Any, rule: QuotaRule, bucket: str, now_ms: int) -> dict[str, int]:
    window = window_at(rule.period, rule.tz, now_ms)
    raw = client.hgetall(QK.bucket(rule.id, bucket, window.id))
    return {str(k): int(v) for k, v in raw.items()}


def _tree_spend(client: Any, root: str) -> int:
    return int(client.hget(KS.ctx(root, root), "u:usd") or 0)


def _many_processes(url: str, client: Any, *, lease: bool) -> None:
    quotas = Quotas(Coordinator.from_url(url, token_keys=TEST_KEYS))
    quotas.set(TEAM, actor="test")
    quotas.set(USER, actor="test")
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=quota_procs.spend_until_refused,
                           args=(url, USERS[i % 3], lease, out)) for i in range(20)]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    now_ms = quotas.coord.store.server_time_ms()
    team = _bucket(client, TEAM, "team=research", now_ms)
    assert team["s:usd"] <= 1_000_000  # never over the team's quota
    assert team["g:usd"] == 0  # nothing held in grants after the processes end
    assert client.hlen(QK.grants(TEAM.id)) == 0 and client.hlen(QK.grants(USER.id)) == 0
    total = 0
    for user in USERS:
        mine = [r for r in results if r["user"] == user]
        spent = sum(_tree_spend(client, root) for r in mine for root in r["roots"])
        bucket = _bucket(client, USER, f"team=research,user={user}", now_ms)
        held = {root: client.hget(KS.ctx(root, root), "h:usd") for r in mine
                for root in r["roots"]}
        # exact, and within $0.40
        assert bucket["s:usd"] == spent <= 400_000, (user, bucket, spent, held)
        assert bucket["g:usd"] == 0
        assert sum(r["calls"] for r in mine) * 10_000 == spent  # no call over
        total += spent
    assert team["s:usd"] == total
    assert total >= 900_000  # the processes drew the quota down, not a few cents of it
    for r in results:
        for root in r["roots"]:
            if client.exists(KS.ctx(root, root)):  # (an open that never landed: none)
                check_tree(client, root)
        assert r["refusals"], r
        for refusal in r["refusals"]:
            assert refusal["reason"] == "quota_exceeded"
            assert refusal["detail"].startswith(("quota team-day bucket team=research",
                                                 "quota user-day bucket team=research,user="))
            assert "period day window" in refusal["detail"]
            assert "next window opens" in refusal["detail"]
            assert refusal["stopped"] is None  # the tree itself is not stopped
    quotas.coord.close()


@pytest.mark.slow
def test_twenty_processes_three_users_team_and_user_day_quotas(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    _many_processes(redis_url, client, lease=False)


@pytest.mark.slow
def test_twenty_processes_in_lease_mode(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    _many_processes(redis_url, client, lease=True)


def test_a_labelled_root_is_opened_with_its_quota_buckets(coord: Coordinator,
                                                         redis_url: str) -> None:
    """The buckets a root's labels match are written by the open itself: a reserve of any
    process that sees the root sees them (queued behind the open, a write-behind flush
    could land after the root's first calls, which then drew from no quota)."""
    Quotas(coord).set(USER, actor="test")
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        h = raw.hgetall(KS.ctx(ctx.chain_id, ctx.chain_id))  # no flush since the open
        assert h["q"] == "1" and h["q1:g"] == ""
        assert h["q1:id"] == '["user-day", "team=research,user=ann"]'
        assert run_sync(ctx._state, ctx, "llm", _spend, CALL).decision == Decision.ALLOW
    window = window_at(USER.period, USER.tz, coord.store.server_time_ms())
    assert _bucket(raw, USER, "team=research,user=ann", window.start_ms)["s:usd"] == 10_000


def test_fixed_window_turns_and_the_old_bucket_expires(coord: Coordinator) -> None:
    rule = QuotaRule(id="burst", match={"user": "*"}, usd=0.05, period="3s", retention_s=1)
    Quotas(coord).set(rule, actor="test")
    # start just after a window opened, so that the calls fit in it
    now = coord.store.server_time_ms()
    time.sleep((3000 - now % 3000 + 50) / 1000)
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        first = window_at(rule.period, rule.tz, coord.store.server_time_ms())
        outcomes = [run_sync(ctx._state, ctx, "llm", _spend, CALL) for _ in range(6)]
        assert [o.decision for o in outcomes] == [Decision.ALLOW] * 5 + [Decision.HALT]
        assert outcomes[-1].reason == "quota_exceeded"
        assert f"window {first.id}" in outcomes[-1].detail
        time.sleep((first.end_ms - coord.store.server_time_ms() + 50) / 1000)
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW  # a new window
        assert ctx.stop_reason is None
        old = QK.bucket(rule.id, "user=ann", first.id)
        assert int(coord.client.hget(old, "s:usd")) == 50_000  # the old grant settled
        assert coord.client.pttl(old) <= 1000 + 3000
        history = Quotas(coord).history(rule, "user=ann")
        assert history[first.id]["usd"] == 50_000 and list(history)[0] == first.id
    time.sleep(1.2)
    assert not coord.client.exists(old)  # expired after its retention


def _other_process_sets(url: str, rule: QuotaRule) -> None:
    c = Coordinator.from_url(url, token_keys=TEST_KEYS)
    Quotas(c).set(rule, actor="ops@elsewhere")
    c.close()


def test_changing_a_limit_from_another_process_applies_to_the_next_call(
        coord: Coordinator, redis_url: str) -> None:
    rule = QuotaRule(id="user-cap", match={"user": "*"}, usd=0.03, period="day")
    Quotas(coord).set(rule, actor="test")
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        for _ in range(3):
            assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
        assert run_sync(ctx._state, ctx, "llm", _spend, CALL).reason == "quota_exceeded"
        raise_it = SPAWN.Process(target=_other_process_sets,
                                 args=(redis_url, dataclasses.replace(rule, usd=0.06)))
        raise_it.start()
        raise_it.join(30)
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW  # at once
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
        lower = SPAWN.Process(target=_other_process_sets,
                              args=(redis_url, dataclasses.replace(rule, usd=0.02)))
        lower.start()
        lower.join(30)
        refused = run_sync(ctx._state, ctx, "llm", _spend, CALL)
        assert refused.decision == Decision.HALT and refused.reason == "quota_exceeded"
        assert ctx.stop_reason is None
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert bucket["s:usd"] == 50_000  # lowering the limit rewrote no spend
    audit = Quotas(coord).audit(rule.id)
    assert [(a["actor"], a["action"]) for a in audit] == [
        ("test", "set"), ("ops@elsewhere", "set"), ("ops@elsewhere", "set")]
    assert '"usd": 0.02' in audit[-1]["after"] or '"usd":0.02' in audit[-1]["after"]


def test_a_sigkilled_holders_grant_is_reclaimed_and_spend_is_exact(
        coord: Coordinator, redis_url: str) -> None:
    rule = QuotaRule(id="user-kill", match={"user": "*"}, usd=0.20, period="day")
    Quotas(coord).set(rule, actor="test")
    ready = SPAWN.Queue()
    holder = SPAWN.Process(target=quota_procs.hold_grant, args=(redis_url, "ann", ready))
    holder.start()
    dead_root = ready.get(timeout=60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert coord.client.hlen(QK.grants(rule.id)) == 1  # the dead process's grant
    time.sleep(1.7)  # its lease (1.5 s) runs out
    other = Coordinator.from_url(redis_url, token_keys=TEST_KEYS, lease_ms=1500)
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=other) as ctx:
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW  # takes, finds it expired
        deadline = time.monotonic() + 10
        while coord.client.hlen(QK.grants(rule.id)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    other.close()
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    # the dead tree: 5 calls settled and one in flight (charged at its estimate)
    dead = _tree_spend(coord.client, dead_root) + int(
        coord.client.hget(KS.ctx(dead_root, dead_root), "h:usd") or 0)
    assert dead == 60_000
    assert bucket["s:usd"] == dead + 10_000  # exact: the dead tree's and the new one's
    assert bucket["g:usd"] == 0
    assert coord.client.hlen(QK.grants(rule.id)) == 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster() as c:
        yield c


def test_on_a_cluster_quotas_and_trees_live_on_different_primaries(cluster: Cluster) -> None:
    cluster.flush()
    coord = Coordinator.from_url(cluster.url, token_keys=TEST_KEYS)
    quotas = Quotas(coord)
    quotas.set(TEAM, actor="test")
    rule_node = coord.client.get_node_from_key(QK.rule(TEAM.id)).name
    roots, spent, refused = [], 0, None
    while refused is None:
        ctx = ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                               coordinator=coord)
        roots.append(ctx.chain_id)
        for _ in range(10):
            outcome = run_sync(ctx._state, ctx, "llm", _spend, CALL)
            if outcome.decision != Decision.ALLOW:
                refused = outcome
                break
            spent += 10_000
        ctx.close()
    tree_nodes = {coord.client.get_node_from_key(KS.ctx(r, r)).name for r in roots}
    assert tree_nodes - {rule_node}  # trees on other primaries than the quota
    assert refused.reason == "quota_exceeded"
    team = _bucket(coord.client, TEAM, "team=research", coord.store.server_time_ms())
    assert team["s:usd"] == spent == 1_000_000
    assert team["g:usd"] == 0
    for r in roots:
        check_tree(coord.client, r)
    coord.close()


def test_spend_shows_in_the_bucket_while_the_tree_runs(redis_url: str) -> None:
    coord = Coordinator.from_url(redis_url, token_keys=TEST_KEYS, lease_ms=900)
    rule = QuotaRule(id="user-live", match={"user": "*"}, usd=1.0, period="day")
    Quotas(coord).set(rule, actor="test")
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        for _ in range(3):
            assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
        coord.store.flush()
        deadline = time.monotonic() + 10
        seen: dict[str, int] = {}
        while seen.get("s:usd") != 30_000 and time.monotonic() < deadline:
            time.sleep(0.1)  # the grant's renewal (every lease / 3) reports the spend
            seen = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
        assert seen["s:usd"] == 30_000  # shown while the grant is still held
        granted = int(coord.client.hget(KS.ctx(ctx.chain_id, ctx.chain_id), "q1:l:usd"))
        assert seen["g:usd"] == granted - 30_000
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
    done = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert (done["s:usd"], done["g:usd"]) == (40_000, 0)  # counted once, nothing held
    coord.close()


def test_async_calls_draw_grants_on_the_io_thread(coord: Coordinator) -> None:
    rule = QuotaRule(id="user-async", match={"user": "*"}, usd=0.03, period="day")
    Quotas(coord).set(rule, actor="test")

    async def main() -> list[Decision]:
        async with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                                    coordinator=coord) as ctx:
            async def spend() -> None:
                report_usage(cost_usd=0.01)
            return [await ctx.awrap_llm_call(spend, CALL) for _ in range(4)]

    assert asyncio.run(main()) == [Decision.ALLOW] * 3 + [Decision.HALT]
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert (bucket["s:usd"], bucket["g:usd"]) == (30_000, 0)


def test_a_late_apply_of_an_ended_grant_never_starts_it(coord: Coordinator) -> None:
    """A take whose grant is revoked (a rule change) before its process puts it into the
    tree: the late apply is refused, so the tree cannot spend a grant already settled."""
    rule = QuotaRule(id="user-race", match={"user": "*"}, usd=0.05, period="day")
    quotas = Quotas(coord)
    quotas.set(rule, actor="test")
    ctx = ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"), coordinator=coord)
    coord.store.flush()
    root = ctx.chain_id
    window = window_at(rule.period, rule.tz, coord.store.server_time_ms())
    qs = quotas.qs
    stored = quotas.get(rule.id)
    granted = qs.take(rule.id, stored.version, "user=ann",
                      (window.id, window.start_ms, window.end_ms), 0, root, 1, "late1",
                      coord.store.lease_ms, 1000, {"usd": (50_000, 10_000)})
    assert not isinstance(granted, NotGranted)
    quotas.set(rule, actor="test")  # revokes: the grant ends before it was applied
    assert qs.apply(root, 1, granted.grant_id, window.id, window.end_ms,
                    granted.amounts) == granted.grant_id  # refused: it ended
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert bucket["g:usd"] == 0
    outcomes = [run_sync(ctx._state, ctx, "llm", _spend, CALL) for _ in range(6)]
    assert [o.decision for o in outcomes] == [Decision.ALLOW] * 5 + [Decision.HALT]
    ctx.close()
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert (bucket["s:usd"], bucket["g:usd"]) == (50_000, 0)


def test_a_corrupt_grant_field_fails_closed(coord: Coordinator) -> None:
    rule = QuotaRule(id="user-corrupt", match={"user": "*"}, usd=0.05, period="day")
    Quotas(coord).set(rule, actor="test")
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
        coord.client.hset(KS.ctx(ctx.chain_id, ctx.chain_id), "q1:u:usd", "1e999")
        refused = run_sync(ctx._state, ctx, "llm", _spend, CALL)
        assert (refused.decision, refused.reason) == (Decision.HALT, "state_corrupt")
        assert int(coord.client.hget(KS.ctx(ctx.chain_id, ctx.chain_id), "u:usd")) == 10_000
        granted = int(coord.client.hget(KS.ctx(ctx.chain_id, ctx.chain_id), "q1:l:usd"))
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert (bucket["s:usd"], bucket["g:usd"]) == (granted, 0)  # the whole grant: never under


def test_the_token_ledger_draws_grants_like_a_call(coord: Coordinator) -> None:
    """A ledger reservation in a tree with quotas tops up its grant as a call does, and
    the quota's own limit refuses it (quota_exceeded) without stopping the tree."""
    rule = QuotaRule(id="user-ledger", match={"user": "*"}, tokens=1000, period="day")
    Quotas(coord).set(rule, actor="test")
    with ExecutionContext(CONFIG, metadata=quota_procs.labelled("ann"),
                          coordinator=coord) as ctx:
        held = [ctx.ledger.reserve(input_tokens=300) for _ in range(3)]
        with pytest.raises(PromptEvaluationError) as refused:
            ctx.ledger.reserve(input_tokens=300)
        assert refused.value.reason == "quota_exceeded"
        for reservation in held:
            ctx.ledger.consume(reservation, input_tokens=250)
        assert ctx.stop_reason is None
    bucket = _bucket(coord.client, rule, "user=ann", coord.store.server_time_ms())
    assert (bucket["s:tok"], bucket["g:tok"]) == (750, 0)
