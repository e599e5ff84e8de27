"""The context token's size is bounded by design: a child whose token would pass the
4 KiB cap (the ancestor path grows by one id a level) is refused with a typed error
before anything is recorded, so every context that exists can be attached to."""

from __future__ import annotations

import uuid

import pytest

from coordinator import ChainMetadata, Coordinator, Decision, ExecutionConfig, ExecutionContext
from coordinator.core.token_codec import MAX_TOKEN_BYTES
from coordinator.errors import BudgetCoordinatorError, ContextDepthError
from tests.support.invariants import check_tree

CONFIG = ExecutionConfig(max_cost_usd=10.0, max_steps=10_000, max_retries_total=10)


def context_keys(coord: Coordinator) -> int:
    return sum(1 for _ in coord.client.scan_iter(match="bc:*:ctx:*", count=1000))


def test_spawn_child_refuses_the_depth_whose_token_would_pass_4_kib(
        coord: Coordinator) -> None:
    root = ExecutionContext(CONFIG, coordinator=coord)
    chain = [root]
    while True:
        try:
            chain.append(chain[-1].spawn_child())
        except ContextDepthError as exc:
            refused = exc
            break
        assert len(chain) < 200, "spawn_child never refused a depth"
    deepest = chain[-1]
    assert refused.depth == len(chain) == 86  # default ids: depth 86 is refused
    assert refused.token_bytes > MAX_TOKEN_BYTES == refused.cap
    assert isinstance(refused, BudgetCoordinatorError)
    assert "depth 86" in str(refused) and "4096-byte cap" in str(refused)
    # every context that exists has a token another process accepts
    token = deepest.token
    assert len(token) <= MAX_TOKEN_BYTES
    attached = ExecutionContext.attach(token, coordinator=coord)
    assert attached.wrap_llm_call(lambda: None) == Decision.ALLOW
    # refused before anything is recorded, through every door
    before = context_keys(coord)
    for spawn in (deepest.spawn_child,
                  lambda: ExecutionContext.spawn_from_token(token, coordinator=coord),
                  lambda: deepest.spawn_child(metadata=ChainMetadata(
                      request_id="r", chain_id=uuid.uuid4().hex))):
        with pytest.raises(ContextDepthError):
            spawn()
    assert context_keys(coord) == before
    for ctx in reversed(chain):
        ctx.close()
    coord.store.flush()
    check_tree(coord.client, root.root_id)


def test_short_ids_go_deeper_under_the_same_cap(coord: Coordinator) -> None:
    root = ExecutionContext(CONFIG, coordinator=coord,
                            metadata=ChainMetadata(request_id="r", chain_id="d0"))
    ctx = root
    for depth in range(1, 151):
        ctx = ctx.spawn_child(metadata=ChainMetadata(request_id="r", chain_id=f"d{depth}"))
    assert ctx.wrap_llm_call(lambda: None) == Decision.ALLOW
    assert len(ctx.token) <= MAX_TOKEN_BYTES
    assert root.get_snapshot().step_count == 1  # rolled up 150 levels
    ctx.close()
    root.close()
