"""Wait for approval (ExecutionConfig.approval_wait_s, issue 32): a call that meets a
ceiling waits for an operator's raise instead of halting at once, and the root's hash
shows the tree waiting meanwhile (store/approval.py's three fields)."""

from __future__ import annotations

import time

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.store.approval import end_wait, start_wait, waiting_for_approval


def _root(usd: float = 0.05) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=100,
                                            max_retries_total=5))


def test_the_root_hash_shows_a_wait_until_it_ends(coord: Coordinator) -> None:
    root = _root()
    child = root.spawn_child()
    store, rid = coord.store, root.root_id
    assert waiting_for_approval(store, rid) is None
    until_ms = start_wait(store, rid, child.chain_id, "budget_exceeded", 5000)
    shown = waiting_for_approval(store, rid)
    assert shown == {"approval_ctx": child.chain_id, "approval_reason": "budget_exceeded",
                     "approval_until_ms": until_ms}
    assert 4000 < until_ms - int(time.time() * 1000) < 6000
    # a later wait replaces it; the earlier one's end leaves the later one shown
    later = start_wait(store, rid, root.chain_id, "step_limit_exceeded", 5000)
    assert not end_wait(store, rid, child.chain_id, until_ms)
    assert waiting_for_approval(store, rid) is not None
    assert end_wait(store, rid, root.chain_id, later)
    assert waiting_for_approval(store, rid) is None
    assert not {"approval_ctx", "approval_reason", "approval_until_ms"} & set(
        store.read_hash(rid, rid))
    # a wait whose end passed is not shown even if its fields stayed (its process died)
    start_wait(store, rid, rid, "budget_exceeded", 1)
    time.sleep(0.01)
    assert waiting_for_approval(store, rid) is None
    assert start_wait(store, "gone", "gone", "budget_exceeded", 1000) == 0
    child.close()
    root.close()
