"""The async twins that only forward to their sync members: ``aabort`` and ``aattach``
behave as ``abort`` and ``attach`` do, seen from a coroutine."""

from __future__ import annotations

import asyncio

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    report_usage,
)
from coordinator.core.keys import KeySpace
from coordinator.errors import ContextNotFoundError, TokenSignatureError
from tests.support.invariants import check_tree

KS = KeySpace()


def _config() -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=3)


def test_aabort_cancels_running_work_and_stops_the_subtree_durably(
        coord: Coordinator) -> None:
    root = ExecutionContext(_config())
    child = root.spawn_child()

    async def main() -> Decision:
        started = asyncio.Event()

        async def long_call() -> None:
            started.set()
            await asyncio.sleep(3600)

        running = asyncio.create_task(child.awrap_llm_call(long_call))
        await started.wait()
        await root.aabort("operator said stop")
        return await running  # cancelled, not left to its hour

    assert asyncio.run(main()) == Decision.HALT
    h = coord.client.hgetall(KS.ctx(root.chain_id, root.chain_id))
    assert h["status"] == "stopped" and h["reason"] == "aborted"  # durable in Redis
    assert child.get_snapshot().stopped_by == root.chain_id  # and it holds below
    snap = root.get_snapshot()
    assert snap.aborted and snap.abort_reason == "aborted"
    assert any(e.reason == "operator said stop" for e in snap.events)
    assert child.wrap_llm_call(lambda: None) == Decision.HALT
    child.close()
    root.close()
    check_tree(coord.client, root.chain_id)


def test_aabort_refuses_a_reason_that_is_not_a_string_before_anything_changes(
        coord: Coordinator) -> None:
    root = ExecutionContext(_config())

    async def main() -> None:
        with pytest.raises(TypeError, match="reason"):
            await root.aabort(42)  # type: ignore[arg-type]

    asyncio.run(main())
    assert root.stop_reason is None
    assert not root.get_snapshot().aborted
    assert root.wrap_llm_call(lambda: None) == Decision.ALLOW
    root.close()


def test_aattach_joins_the_context_a_token_names(coord: Coordinator) -> None:
    root = ExecutionContext(_config())
    token = root.token

    async def main() -> tuple[str, Decision]:
        handle = await ExecutionContext.aattach(token)

        async def spend() -> None:
            report_usage(cost_usd=0.02)

        decision = await handle.awrap_llm_call(spend)
        await handle.aclose()  # flushes; the owner's close closes the context
        return handle.chain_id, decision

    chain_id, decision = asyncio.run(main())
    assert chain_id == root.chain_id and decision == Decision.ALLOW
    snap = root.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.02)
    assert snap.status == "running"  # a handle's close does not close the context
    root.close()
    assert check_tree(coord.client, root.chain_id) == 20_000


def test_aattach_raises_the_typed_errors_of_attach(coord: Coordinator) -> None:
    root = ExecutionContext(_config())
    token = root.token
    body, sig = token.split(".")
    forged = body + "." + ("A" if sig[0] != "A" else "B") + sig[1:]

    async def main() -> None:
        with pytest.raises(TokenSignatureError):
            await ExecutionContext.aattach(forged)
        coord.client.delete(KS.ctx(root.chain_id, root.chain_id))  # its keys expired
        with pytest.raises(ContextNotFoundError):
            await ExecutionContext.aattach(token)

    asyncio.run(main())


def test_aspawn_child_opens_a_child_whose_spend_counts_above(coord: Coordinator) -> None:
    root = ExecutionContext(_config())

    async def main() -> tuple[ExecutionContext, Decision]:
        child = await root.aspawn_child(max_cost_usd=0.5, max_steps=5)

        async def spend() -> None:
            report_usage(cost_usd=0.03)

        decision = await child.awrap_llm_call(spend)
        await child.aclose()
        return child, decision

    child, decision = asyncio.run(main())
    assert decision == Decision.ALLOW
    assert child.parent is root and child.path[-2:] == (root.chain_id, child.chain_id)
    snap = child.get_snapshot()
    assert (snap.max_cost_usd, snap.max_steps, snap.status) == (0.5, 5, "closed")
    assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.03)
    root.close()
    assert check_tree(coord.client, root.chain_id) == 30_000
