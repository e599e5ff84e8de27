"""A context's node records and events are lists capped by lua/lib/common.lua append_capped:
past its cap by a tenth, a list is trimmed to its cap newest entries."""

from __future__ import annotations

import json

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.store import tree
from coordinator.store.wire import Op

BIG = ExecutionConfig(max_cost_usd=1000.0, max_steps=100_000, max_retries_total=100)


def test_a_list_is_trimmed_to_its_newest_entries_once_past_its_cap(coord: Coordinator) -> None:
    key = coord.keyspace.events("capped", "capped")
    lengths = []
    for i in range(45):
        coord.store.wire.run(Op("append", [key], [20, f"e{i}"]))
        lengths.append(coord.client.llen(key))
    assert max(lengths) == 22  # cap 20 plus a tenth
    assert lengths[21:23] == [22, 20]  # the 23rd append trims back to 20
    assert coord.client.lrange(key, -1, -1) == ["e44"]
    assert coord.client.lrange(key, 0, -1) == [f"e{i}" for i in range(45 - lengths[-1], 45)]


def test_node_records_keep_the_newest_calls_under_the_cap(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tree, "NODE_STREAM_CAP", 10)
    with ExecutionContext(BIG, coordinator=coord) as root:
        for i in range(30):
            root.wrap_llm_call(lambda: None, WrapOptions(operation_name=f"call {i}"))
        coord.store.flush()
        stored = [json.loads(n)["operation_name"] for n in
                  coord.client.lrange(coord.keyspace.nodes(root.root_id, root.chain_id), 0, -1)]
        # Settles land in about the order the calls finished: one sent by the flusher can
        # land after the next call's, so the trim may keep the 11th newest instead.
        assert 10 <= len(stored) <= 11
        assert set(stored) <= {f"call {i}" for i in range(30 - len(stored) - 1, 30)}
        snapshot = root.get_snapshot()
        names = [n.operation_name for n in snapshot.nodes]
        assert names == sorted(stored, key=lambda name: int(name.split()[1]))
        assert snapshot.step_count == 30  # the counters count every call


def test_a_snapshot_lists_calls_in_the_order_they_finished(coord: Coordinator) -> None:
    with ExecutionContext(BIG, coordinator=coord) as root:
        for i in range(5):
            root.wrap_llm_call(lambda: None, WrapOptions(operation_name=f"call {i}"))
        coord.store.flush()
        key = coord.keyspace.nodes(root.root_id, root.chain_id)
        first, second = coord.client.lrange(key, 1, 2)
        coord.client.lset(key, 1, second)  # as if call 2's settle had landed before call 1's
        coord.client.lset(key, 2, first)
        names = [n.operation_name for n in root.get_snapshot().nodes]
        assert names == [f"call {i}" for i in range(5)]
