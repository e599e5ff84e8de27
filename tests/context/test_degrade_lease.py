"""The final reserve and model ladders in lease mode (docs/degrade.md, docs/leases.md): a
slice never holds a level's final reserve (lease_take.lua), so ordinary calls served
from slices stop short of it and are refused with ``final_reserve`` without stopping the
context, while final calls spend it through strict reserves; a ladder call served from a
slice runs on the rung the slice chooses (the requested model while the slice was taken
above the threshold, the cheapest that fits below it), and its degradation is counted
when the slice's batch is flushed (nd at every level, one 'degraded' event per context
and pair); exact books with four processes racing."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    Degrade,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    current_call,
    report_usage,
)
from coordinator.context.lease_registry import slice_of
from coordinator.core.keys import KeySpace
from coordinator.core.paths import Path
from coordinator.store.leases_store import Batch, LeaseStore, Taken, decode_take
from tests.support import edge_procs, lease_edge_procs
from tests.support.invariants import check_tree
from tests.support.together import run_together

KS = KeySpace()
LEASE = LeasePolicy(usd=0.05, steps=1000, tokens=100_000, max_age_ms=2000)
LADDER = Degrade(ladder={"gpt-4o": ["gpt-4o-mini"]}, below=0.5)
GPT4O = edge_procs.LADDER_CALL
FULL, MINI = 12_500, 750  # micro-USD: gpt-4o and gpt-4o-mini at 1,000 tokens each way
CENT = WrapOptions(cost_estimate_hint=0.01)


def _root(usd: float, **edge: Any) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=10_000,
                                            max_retries_total=5, lease=LEASE, **edge))


def _cent(ctx: ExecutionContext, options: WrapOptions = CENT) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01), options)


def _ran_on(ctx: ExecutionContext) -> tuple[Decision, str | None]:
    seen: list[str | None] = []

    def call() -> None:
        info = current_call()
        assert info is not None
        seen.append(info.model)
        report_usage(input_tokens=1000, output_tokens=1000, model=info.model)

    return ctx.wrap_llm_call(call, GPT4O), seen[0] if seen else None


def _books(coord: Coordinator, root: ExecutionContext) -> int:
    """Exact books, nothing held, no slice open: every handle of the tree was closed or
    detached (its slice given back) before."""
    return check_tree(coord.client, root.root_id)



# -- the final reserve ---------------------------------------------------------------------

def test_a_slice_never_holds_the_final_reserve(coord: Coordinator) -> None:
    root = _root(0.10, final_reserve_usd=0.03)
    assert _cent(root) == Decision.ALLOW
    lease = slice_of(root._state)
    assert lease is not None and lease.slice_id is not None  # served from a slice...
    held = coord.client.hget(KS.ctx(root.root_id, root.root_id), "h:usd")
    # ...of a quarter (one lessee) of the $0.07 ordinary calls may spend, not of $0.10
    assert held == "17500"
    root.close()
    assert _books(coord, root) == 10_000


def test_ordinary_calls_stop_at_the_reserve_and_final_calls_spend_it(
        coord: Coordinator) -> None:
    root = _root(0.10, final_reserve_usd=0.03)
    decisions = [_cent(root) for _ in range(9)]
    assert decisions == [Decision.ALLOW] * 7 + [Decision.HALT] * 2
    snap = root.get_snapshot()
    assert snap.status == "running" and root.stop_reason is None
    assert [n.stop_reason for n in snap.nodes if n.stop_reason] == ["final_reserve"] * 2
    final = WrapOptions(cost_estimate_hint=0.01, final=True)
    assert [_cent(root, final) for _ in range(4)] == [Decision.ALLOW] * 3 + [Decision.HALT]
    assert root.get_snapshot().nodes[-1].stop_reason == "budget_exceeded"
    root.close()
    assert _books(coord, root) == 100_000


def test_a_childs_ordinary_call_is_held_to_its_ancestors_reserve(coord: Coordinator) -> None:
    root = _root(0.10, final_reserve_usd=0.03)
    child = root.spawn_child(max_cost_usd=0.05)
    assert child.config.lease == LEASE
    while _cent(root) == Decision.ALLOW:
        pass
    assert _cent(child) == Decision.HALT
    assert child.get_snapshot().nodes[-1].stop_reason == "final_reserve"
    assert child.stop_reason is None and root.stop_reason is None
    assert _cent(child, WrapOptions(cost_estimate_hint=0.01, final=True)) == Decision.ALLOW
    child.close()
    root.close()
    assert _books(coord, root) == 80_000


@pytest.mark.slow
def test_four_leasing_processes_spend_exactly_up_to_the_reserve_then_final_calls_spend_it(
        coord: Coordinator, redis_url: str) -> None:
    root = _root(0.10, final_reserve_usd=0.03)
    results = run_together(lease_edge_procs.cents_until_quiet, (redis_url, root.token))
    assert sum(ran for ran, _ in results) == 7
    assert all(stop is None for _, stop in results)
    snap = root.get_snapshot()
    refusals = [n.stop_reason for n in snap.nodes if n.stop_reason]
    assert refusals and set(refusals) == {"final_reserve"}
    assert snap.status == "running" and root.stop_reason is None
    assert _books(coord, root) == 70_000
    # then final calls spend the reserve (strict reserves: no slice may hold it), no more
    results = run_together(edge_procs.run_cent_calls, (redis_url, root.token, True))
    assert sum(ran for ran, _ in results) == 3
    refusals = [n.stop_reason for n in root.get_snapshot().nodes if n.stop_reason]
    assert set(refusals[len(refusals) - 4:]) <= {"budget_exceeded"}
    root.close()
    assert _books(coord, root) == 100_000


# -- model ladders ---------------------------------------------------------------------------

def _degraded(coord: Coordinator, root: ExecutionContext) -> tuple[int, int]:
    """The root's degraded calls (nd) and its 'degraded' events."""
    nd = int(coord.client.hget(KS.ctx(root.root_id, root.root_id), "nd") or 0)
    events = [e for e in root.get_snapshot().events if e.event_type == "degraded"]
    return nd, len(events)


def test_a_take_reports_low_and_then_need_only_cover_the_cheapest_rung(
        coord: Coordinator) -> None:
    root = _root(0.10, degrade=LADDER)
    path, leases = Path(root.root_id, (root.root_id,)), LeaseStore(coord.store)

    def take(slice_id: str, low_least: int = MINI) -> Taken | None:
        op = leases.take_op(path, slice_id, "owner", 60_000, {"usd": (50_000, FULL)},
                            return_on_expiry=False, below_ppm=500_000, low_least=low_least)
        taken = decode_take(coord.store.wire.run(op))
        return taken if isinstance(taken, Taken) else None

    # a quarter of what is left each time (one lessee): $0.025, $0.01875, $0.0140625
    # (each covers gpt-4o, and half the ceiling was left before each take)...
    got = [take(f"slice:{i}") for i in range(3)]
    assert [(t.amounts["usd"], t.low) for t in got if t] == [
        (25_000, False), (18_750, False), (14_062, False)]
    assert take("slice:x", low_least=0) is None  # $0.042188 left: $0.010547 < gpt-4o's
    low = take("slice:3")  # ...but below the threshold the mini's worst case will do
    assert low is not None and low.low and low.amounts["usd"] == 10_547
    for i in range(4):
        coord.store.wire.run(leases.flush_op(path, f"slice:{i}", Batch(1, [], [], {}),
                                             give_back=True))
    root.close()
    assert _books(coord, root) == 0


def test_served_calls_take_the_cheaper_rung_once_a_slice_is_taken_below_the_threshold(
        coord: Coordinator) -> None:
    root = _root(0.50, degrade=LADDER)
    ran = []
    while (result := _ran_on(root))[0] == Decision.ALLOW:
        ran.append(result[1])
    # slices of $0.05 (4 gpt-4o calls each) taken while at least $0.25 remained, at
    # $0 .. $0.25 spent: 24 gpt-4o calls (strict mode: 21); the slice taken at $0.30
    # spent is below the threshold, and so is every later one: the mini from then on
    assert ran[:25] == ["gpt-4o"] * 24 + ["gpt-4o-mini"]
    assert set(ran[24:]) == {"gpt-4o-mini"}
    minis = len(ran) - 24
    assert 500_000 - MINI < 24 * FULL + minis * MINI <= 500_000
    nodes = [n for n in root.get_snapshot().nodes if n.status == "ok"]
    assert [n.model for n in nodes] == ran
    assert [n.degraded_from for n in nodes] == [None] * 24 + ["gpt-4o"] * minis
    assert _degraded(coord, root) == (minis, 1)
    root.close()
    assert _books(coord, root) == 24 * FULL + minis * MINI


def test_a_served_degraded_call_counts_at_every_level_and_once_per_context(
        coord: Coordinator) -> None:
    root = _root(0.10, degrade=LADDER)
    child = root.spawn_child()
    assert child.config.lease == LEASE and child.config.degrade == LADDER
    root.wrap_llm_call(lambda: report_usage(cost_usd=0.06), WrapOptions(cost_estimate_hint=0.06))
    assert [_ran_on(child) for _ in range(3)] == [(Decision.ALLOW, "gpt-4o-mini")] * 3
    lease = slice_of(child._state)
    assert lease is not None and lease.slice_id is not None  # served from its slice
    child.close()  # its batch flushed with the slice's give-back
    for ctx_id, events in ((child.chain_id, 1), (root.root_id, 0)):
        assert coord.client.hget(KS.ctx(root.root_id, ctx_id), "nd") == "3"
        raw = coord.client.lrange(KS.events(root.root_id, ctx_id), 0, -1)
        assert sum('"degraded"' in e for e in raw) == events
    root.close()
    assert _books(coord, root) == 60_000 + 3 * MINI


@pytest.mark.slow
def test_four_leasing_processes_degrade_after_the_threshold_with_exact_books(
        coord: Coordinator, redis_url: str) -> None:
    root = _root(0.50, degrade=LADDER)
    results = run_together(edge_procs.run_ladder_calls, (redis_url, root.token))
    models = [m for r in results for m in r]
    full, minis = models.count("gpt-4o"), models.count("gpt-4o-mini")
    assert full + minis == len(models) and full > 0 and minis > 0
    # a gpt-4o call is held by a strict reserve or served from a slice taken while at
    # least half remained (spend and every hold counted): at most half the ceiling,
    # plus the one slice (or call) taken last while it did
    assert full * FULL <= 250_000 + LEASE.usd * 1_000_000
    assert _degraded(coord, root) == (minis, 1)
    nodes = [n for n in root.get_snapshot().nodes if n.status == "ok"]
    assert sorted(n.model or "" for n in nodes) == sorted(m or "" for m in models)
    assert all(n.degraded_from == ("gpt-4o" if n.model == "gpt-4o-mini" else None)
               for n in nodes)
    root.close()
    assert _books(coord, root) == full * FULL + minis * MINI
