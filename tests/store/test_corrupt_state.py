"""Corrupted state fails closed: a limit, counter or deadline field that is not a valid
number stops its level (state_corrupt) instead of lifting a ceiling or raising a raw
ResponseError; a settle that cannot complete changes nothing; a settle whose reservation
was lost still charges the spend, once."""

from __future__ import annotations

import json

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.keys import KeySpace
from tests.support.invariants import check_tree, orphans

KS = KeySpace()
BAD_VALUES = ["abc", "", "1e999", "-5", "1.5", "nan"]


def _config(**kw: object) -> ExecutionConfig:
    base: dict[str, object] = {"max_cost_usd": 0.01, "max_steps": 100,
                               "max_retries_total": 10}
    base.update(kw)
    return ExecutionConfig(**base)  # type: ignore[arg-type]


def _spend(ctx: ExecutionContext, usd: float = 0.05) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


def _events(client: redis.Redis, root: str, ctx_id: str) -> list[dict[str, object]]:
    return [json.loads(e) for e in client.lrange(KS.events(root, ctx_id), 0, -1)]


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("field", ["l:usd", "u:usd", "h:usd", "deadline", "l:steps"])
def test_corrupt_field_stops_the_level_and_never_lifts_the_ceiling(
        coord: Coordinator, field: str, value: str) -> None:
    with ExecutionContext(_config()) as root:
        child = root.spawn_child()
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), field, value)
        # three $0.05 calls under a $0.01 ceiling: none may run, none may raise
        decisions = [_spend(child) for _ in range(3)]
        assert decisions == [Decision.HALT] * 3
        h = coord.client.hgetall(KS.ctx(root.chain_id, root.chain_id))
        assert (h["status"], h["reason"]) == ("stopped", "state_corrupt")
        assert field in h["detail"]
        stops = [e for e in _events(coord.client, root.chain_id, root.chain_id)
                 if e["event_type"] == "state_corrupt"]
        assert len(stops) == 1 and stops[0]["decision"] == "HALT"
        snap = child.get_snapshot()
        assert snap.aborted and snap.abort_reason == "state_corrupt"
        assert snap.stopped_by == root.chain_id
        assert snap.cost_usd_accumulated == 0
        # a child opened under it now is stopped from the start, and inherits nothing
        late = root.spawn_child(max_cost_usd=5.0)
        assert _spend(late, 0.001) == Decision.HALT
        child.close()
        late.close()


@pytest.mark.parametrize("value", ["abc", "1e999"])
def test_corrupt_token_total_limit_stops_the_level(coord: Coordinator, value: str) -> None:
    with ExecutionContext(_config(max_cost_usd=1.0)) as root:
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), "l:ttot", value)
        opts = WrapOptions(cost_estimate_hint=0.01, input_tokens_estimate=100,
                           max_output_tokens=100)
        assert root.wrap_llm_call(lambda: None, opts) == Decision.HALT
        assert root.get_snapshot().abort_reason == "state_corrupt"


@pytest.mark.parametrize("fails", [False, True], ids=["settle", "release"])
def test_corrupt_counter_between_reserve_and_settle_changes_nothing(coord: Coordinator,
                                                                    fails: bool) -> None:
    """A settle (or a failed call's release) that cannot complete (a counter on its path
    is corrupt) charges nothing anywhere, keeps the reservation held and stops the
    level: the spend stays held against every ceiling above, not lost."""
    with ExecutionContext(_config(max_cost_usd=1.0)) as root:
        child = root.spawn_child()
        mid_key = KS.ctx(root.chain_id, child.chain_id)

        def body() -> None:
            coord.client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", "abc")
            report_usage(cost_usd=0.04)
            if fails:
                raise RuntimeError("provider 500")

        grandchild = child.spawn_child()
        assert grandchild.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.05)) \
            == (Decision.RETRY if fails else Decision.ALLOW)
        coord.store.flush()
        assert coord.client.hlen(KS.reservations(root.chain_id)) == 1  # still held
        mid = coord.client.hgetall(mid_key)
        assert mid.get("u:usd", "0") == "0" and mid["h:usd"] == "50000"
        assert mid.get("u:steps", "0") == "0" and mid.get("u:retries", "0") == "0"
        h = coord.client.hgetall(KS.ctx(root.chain_id, root.chain_id))
        assert h["reason"] == "state_corrupt" and h["u:usd"] == "abc"
        assert coord.client.llen(KS.nodes(root.chain_id, grandchild.chain_id)) == 0
        # the refused finish is kept in the record, for the repair (tests/store/test_repair.py)
        raw, = coord.client.hvals(KS.reservations(root.chain_id))
        assert json.loads(raw)["f"][0] == ("error" if fails else "ok")
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", "0")
        grandchild.close()
        child.close()


def test_close_with_corrupt_counters_summarises_instead_of_raising(coord: Coordinator
                                                                   ) -> None:
    root = ExecutionContext(_config(max_cost_usd=1.0))
    assert _spend(root, 0.01) == Decision.ALLOW
    coord.store.flush()
    coord.client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", "1e999")
    root.close()
    assert coord.client.hget(KS.ctx(root.chain_id, root.chain_id), "status") == "closed"


def test_settle_without_reservation_charges_the_path_once(coord: Coordinator) -> None:
    """The reservation vanished (a failover lost it before it reached the replica): the
    settle still charges the actual spend at every level of the path, records a
    SettleOrphaned event, and a repeated settle changes nothing."""
    with ExecutionContext(_config(max_cost_usd=1.0)) as root:
        child = root.spawn_child()
        res_key, leases = KS.reservations(root.chain_id), KS.leases(root.chain_id)

        def body() -> None:  # what a failover to a lagging replica leaves behind
            coord.client.delete(res_key, leases)
            for cid in (root.chain_id, child.chain_id):
                key = KS.ctx(root.chain_id, cid)
                coord.client.hset(key, mapping={f: 0 for f in coord.client.hkeys(key)
                                                if f.startswith("h:")})
            report_usage(cost_usd=0.03)

        assert child.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.05)) \
            == Decision.ALLOW
        coord.store.flush()
        assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.03)
        assert child.get_snapshot().cost_usd_accumulated == pytest.approx(0.03)
        assert orphans(coord.client, root.chain_id) == (30_000, 0)
        # the same settle again (a retried write-behind op): already finished, no change
        node_id = child.get_snapshot().nodes[-1].node_id
        path = child._path
        stops = coord.store.finish(path, node_id, outcome="ok", node=None,
                                   amounts=["usd", 30_000], write_behind=False)
        assert stops == []
        assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.03)
        child.close()
    assert check_tree(coord.client, root.chain_id) == 30_000


def test_settle_of_a_path_that_does_not_exist_is_recorded_not_charged(
        coord: Coordinator) -> None:
    from coordinator.core.paths import Path

    path = Path("ghost-root", ("ghost-root", "ghost-kid"))
    assert coord.store.finish(path, "r1", outcome="ok", node=None,
                              amounts=["usd", 7_000], write_behind=False) == []
    assert orphans(coord.client, "ghost-root") == (0, 7_000)
    assert not coord.client.exists(KS.ctx("ghost-root", "ghost-kid"))
    assert 0 < coord.client.ttl(KS.ledger("ghost-root")) <= 7 * 24 * 3600  # not forever


def test_orphan_metric_counts_the_event(coord: Coordinator) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from coordinator.metrics import PrometheusLedgerObserver

    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusLedgerObserver(registry)
    event = {"type": "SettleOrphaned", "reservation_id": "r", "path": [], "charged": False,
             "amounts": {"usd": 5}, "ts": 1}
    assert observer(event) is True
    assert registry.get_sample_value("budget_orphan_settles_total",
                                     {"charged": "false"}) == 1.0
