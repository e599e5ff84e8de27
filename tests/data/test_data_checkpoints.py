"""Checkpoints: the data stack with the specification's metadata, periodic checkpoints,
serialize / deserialize and resume into a new tree (budgets start afresh)."""

from __future__ import annotations

import time

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.data import DataKeys

CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)


def test_checkpoint_records_the_visible_stack_with_metadata(coord: Coordinator) -> None:
    meta = ChainMetadata(request_id="r", chain_id="root-cp", tags={"env": "test"})
    with ExecutionContext(CONFIG, metadata=meta) as root:
        root.data.set("a", 1)
        step = root.spawn_child(step_name="Fetch User")
        step.data.set("b", 2)
        leaf = step.spawn_child(step_name="Leaf")
        leaf.data.set("c", 3)
        record = leaf.checkpoint("cp-stack")
        assert [lv["data"] for lv in record["stack"]] == [{"a": 1}, {"b": 2}, {"c": 3}]
        metas = [lv["metadata"] for lv in record["stack"]]
        assert [m["step_id"] for m in metas] == [root.chain_id, step.chain_id, leaf.chain_id]
        assert [m["step_name"] for m in metas] == [None, "Fetch User", "Leaf"]
        assert metas[-1]["checkpoint_id"] == "cp-stack"
        assert set(metas[-1]) == {"created_at", "step_name", "step_id", "checkpoint_id",
                                  "is_parallel", "isolation_level", "tags"}
        assert metas[0]["tags"] == {"env": "test"}
        assert abs(metas[-1]["created_at"] - time.time()) < 60
        # a sandboxed context's stack stops at itself
        box = step.spawn_child(isolation="sandboxed")
        box.data.set("d", 4)
        assert [lv["data"] for lv in box.checkpoint("cp-box")["stack"]] == [{"d": 4}]
        # taking an id again replaces it
        leaf.data.set("c", 30)
        leaf.checkpoint("cp-stack")
        resumed = ExecutionContext.resume("cp-stack", CONFIG)
        assert resumed.data.to_dict() == {"a": 1, "b": 2, "c": 30}
        for c in (box, leaf, step):
            c.close()
        _close_chain(resumed)


def _close_chain(ctx: ExecutionContext | None) -> None:
    while ctx is not None:
        ctx.close()
        ctx = ctx.parent


def test_resume_rebuilds_levels_and_isolation_but_not_budgets(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        root.wrap_llm_call(lambda: report_usage(cost_usd=0.5),
                           WrapOptions(cost_estimate_hint=0.5))
        root.data.set("k", "old")
        branch = root.spawn_child(isolation="isolated", step_name="Render PDF",
                                  is_parallel=True)
        root.data.set("k", "new")
        step = branch.spawn_child()
        step.data.set("mine", True)
        step.checkpoint("cp-iso")
        text = step.serialize()
    new = ExecutionContext.resume("cp-iso", ExecutionConfig(max_cost_usd=1.0, max_steps=5,
                                                            max_retries_total=1))
    assert new.data.to_dict() == {"k": "old", "mine": True}
    parent = new.parent
    assert parent is not None and parent.parent is None
    assert parent.data.isolation.value == "isolated"
    assert parent.data.to_dict(local=True) == {}
    stack = new.checkpoint("cp-again")["stack"]
    assert stack[0]["metadata"]["is_parallel"] is True
    assert stack[0]["metadata"]["step_name"] == "Render PDF"
    assert stack[0]["view"] == {"k": "old"}
    # the new tree is a new run: its own ids and a fresh budget
    assert new.root_id != root.root_id
    snap = parent.get_snapshot()
    assert snap.cost_usd_accumulated == 0 and snap.max_cost_usd == 1.0
    # writes in the resumed tree are its own
    new.data.set("k", "resumed")
    assert root.data.get("k") == "new"
    again = ExecutionContext.deserialize(text, CONFIG)
    assert again.data.to_dict() == {"k": "old", "mine": True}
    _close_chain(again)
    _close_chain(new)


def test_resume_by_root_when_the_locator_is_gone(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.set("x", [1])
        root.checkpoint("cp-loc")
    coord.client.delete(DataKeys(coord.keyspace).checkpoint_locator("cp-loc"))
    resumed = ExecutionContext.resume("cp-loc", CONFIG, root_id=root.root_id)
    assert resumed.data.get("x") == [1]
    resumed.close()


def test_periodic_checkpoints_follow_the_data(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as ctx:
        assert ctx.with_checkpointing(20) is ctx
        ctx.data.set("n", 1)
        _wait_for(lambda: _checkpointed(ctx) == {"n": 1})
        ctx.data.set("n", 2)
        _wait_for(lambda: _checkpointed(ctx) == {"n": 2})
    resumed = ExecutionContext.resume(f"{ctx.chain_id}:auto", CONFIG)
    assert resumed.data.get("n") == 2
    resumed.close()


def _checkpointed(ctx: ExecutionContext) -> object:
    from coordinator.data.checkpoints import load_checkpoint
    from coordinator.data.errors import CheckpointNotFoundError

    try:
        record = load_checkpoint(Coordinator.default(), f"{ctx.chain_id}:auto")
    except CheckpointNotFoundError:
        return None
    return record["stack"][-1]["data"]


def _wait_for(cond: object, timeout: float = 10.0) -> None:
    assert callable(cond)
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail("condition not reached")
        time.sleep(0.01)
