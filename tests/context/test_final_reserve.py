"""The final reserve (docs/degrade.md): ordinary calls under a context cannot spend the
last ``final_reserve_usd`` of its ceiling and are refused with ``final_reserve`` without
stopping it; calls marked final (``WrapOptions(final=True)``, ``ctx.finishing()``) may,
up to the ceiling and no further; exact books with four processes racing."""

from __future__ import annotations

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_call,
    report_usage,
)
from coordinator.errors import InvalidConfigError
from tests.support import edge_procs
from tests.support.invariants import check_tree
from tests.support.together import run_together

CENT = WrapOptions(cost_estimate_hint=0.01)
FINAL_CENT = WrapOptions(cost_estimate_hint=0.01, final=True)


def _root(usd: float = 0.10, reserve: float = 0.03) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=1000,
                                            max_retries_total=5, final_reserve_usd=reserve))


def _cent(ctx: ExecutionContext, options: WrapOptions = CENT) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01), options)


def _books(coord: Coordinator, root: ExecutionContext) -> int:
    root.get_snapshot()  # what this process wrote behind lands first
    return check_tree(coord.client, root.root_id)


def test_ordinary_calls_stop_short_of_the_reserve_and_the_context_keeps_running(
        coord: Coordinator) -> None:
    root = _root()
    decisions = [_cent(root) for _ in range(9)]
    assert decisions == [Decision.ALLOW] * 7 + [Decision.HALT] * 2
    snap = root.get_snapshot()
    assert snap.status == "running" and root.stop_reason is None
    refused = [n for n in snap.nodes if n.stop_reason]
    assert [n.stop_reason for n in refused] == ["final_reserve"] * 2
    assert "before the final reserve of $0.03" in refused[0].stop_detail
    assert _books(coord, root) == 70_000


def test_final_calls_spend_the_reserve_and_no_more(coord: Coordinator) -> None:
    root = _root()
    while _cent(root) == Decision.ALLOW:
        pass
    assert [_cent(root, FINAL_CENT) for _ in range(4)] == [Decision.ALLOW] * 3 + [
        Decision.HALT]
    assert root.get_snapshot().nodes[-1].stop_reason == "budget_exceeded"
    assert _books(coord, root) == 100_000


def test_a_childs_ordinary_call_is_held_to_its_ancestors_reserve(coord: Coordinator) -> None:
    root = _root()
    child = root.spawn_child(max_cost_usd=0.05)
    for _ in range(7):
        assert _cent(root) == Decision.ALLOW
    assert _cent(child) == Decision.HALT
    assert child.get_snapshot().nodes[-1].stop_reason == "final_reserve"
    assert child.stop_reason is None and root.stop_reason is None
    assert _cent(child, FINAL_CENT) == Decision.ALLOW
    assert _books(coord, root) == 80_000


def test_every_call_in_a_finishing_block_is_final_and_none_after_it(
        coord: Coordinator) -> None:
    root = _root()
    child = root.spawn_child()
    while _cent(root) == Decision.ALLOW:
        pass
    finals: list[bool] = []

    def call() -> None:
        info = current_call()
        assert info is not None
        finals.append(info.final)
        report_usage(cost_usd=0.01)

    with root.finishing():
        assert root.wrap_llm_call(call, CENT) == Decision.ALLOW
        assert child.wrap_llm_call(call, CENT) == Decision.ALLOW  # its descendants too
    assert finals == [True, True]
    assert _cent(root) == Decision.HALT
    with child.finishing():  # a child's block does not make its parent's calls final
        assert _cent(root) == Decision.HALT
        assert _cent(child) == Decision.ALLOW
    assert _books(coord, root) == 100_000


def test_an_async_call_in_a_finishing_block_is_final(coord: Coordinator) -> None:
    import asyncio

    root = _root()
    while _cent(root) == Decision.ALLOW:
        pass

    async def cost() -> None:
        report_usage(cost_usd=0.01)

    async def main() -> tuple[Decision, Decision]:
        ordinary = await root.awrap_llm_call(cost, CENT)
        with root.finishing():
            final = await root.awrap_llm_call(cost, CENT)
        return ordinary, final

    assert asyncio.run(main()) == (Decision.HALT, Decision.ALLOW)


@pytest.mark.slow
def test_four_processes_of_ordinary_calls_spend_exactly_up_to_the_reserve(
        coord: Coordinator, redis_url: str) -> None:
    root = _root()
    for final in (False, True):
        results = run_together(edge_procs.run_cent_calls, (redis_url, root.token, final))
        ran = sum(r[0] for r in results)
        snap = root.get_snapshot()
        refusals = [n.stop_reason for n in snap.nodes if n.stop_reason]
        if not final:
            assert ran == 7 and _books(coord, root) == 70_000
            assert set(refusals) == {"final_reserve"} and len(refusals) == 4
            assert snap.status == "running"
            assert all(stop is None for _, stop in results)
        else:  # final calls then spend the reserve, and the ceiling stops them
            assert ran == 3 and _books(coord, root) == 100_000
            assert refusals[4:] and set(refusals[4:]) <= {"budget_exceeded"}


@pytest.mark.parametrize("bad", [
    {"final_reserve_usd": 0.10}, {"final_reserve_usd": 0.2}, {"final_reserve_usd": -0.01},
    {"final_reserve_usd": float("nan")}, {"final_reserve_usd": "0.01"},
    {"warn_at": (1.0,)}, {"warn_at": (-0.1,)}, {"warn_at": (float("nan"),)},
    {"warn_at": (0.5, 0.5)}, {"warn_at": "0.5"}, {"warn_at": (0.1,) * 9},
])
def test_bad_edge_settings_are_refused_with_a_typed_error(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError, match="invalid ExecutionConfig"):
        ExecutionConfig(max_cost_usd=0.10, max_steps=9, max_retries_total=1, **bad)
