"""Node records cross into the scripts as JSON that the scripts decode (DESIGN.md §13,
issue #30), or, for settle and release, next to what is counted of them (node_facts): a
call is counted, and a keyed call remembered, from its record whatever the JSON's
separators, never by matching the text Python's ``json.dumps`` happens to write."""

from __future__ import annotations

import json

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.core.contracts import SETTLE
from coordinator.core.keys import KeySpace
from coordinator.core.paths import Path
from coordinator.models_records import NodeRecord, node_facts
from coordinator.store.leases_store import Batch, LeaseStore
from coordinator.store.records import ReservationRecord
from coordinator.store.tree import Held
from coordinator.store.wire import Op

KS = KeySpace()
CONFIG = ExecutionConfig(max_cost_usd=10.0, max_steps=1000, max_retries_total=10)
COMPACT = (",", ":")


def settle(coord: Coordinator, path: Path, rid: str, node_json: str) -> list[object]:
    """settle.lua of ``rid`` at $0.001 with ``node_json`` as its record, as sent, and what
    it counts of the record as the store sends it (node_facts of the decoded record)."""
    root, cid = path.root, path.ctx_id
    keys = SETTLE.key_list(res=KS.reservations(root), leases=KS.leases(root),
                           nodes=KS.nodes(root, cid), ledger=KS.ledger(root),
                           levels=[KS.ctx(root, cid), KS.events(root, cid)],
                           fin=KS.finished(root), done=KS.done(root), bymodel=KS.by_model(root))
    args = SETTLE.arg_list(reservation_id=rid, abort_channel=KS.abort_channel, node=node_json,
                           node_cap=100, ledger_channel=KS.ledger_channel, late=False,
                           amounts=["usd", 1000], **node_facts(json.loads(node_json)))
    reply: list[object] = coord.store.wire.run(Op(SETTLE.script, keys, args))
    return reply


def test_a_compact_record_is_counted_and_remembered(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        path = Path(root.root_id, (root.root_id,))
        ctx = KS.ctx(root.root_id, root.root_id)
        held = coord.store.reserve(path, "call-1", ["usd", 1000, "steps", 1], keyed=True)
        assert isinstance(held, Held)
        node = {"status": "error", "unreported": True, "provider": "p", "model": "m"}
        assert settle(coord, path, "call-1", json.dumps(node, separators=COMPACT))[0] == 1
        counts = coord.client.hmget(ctx, "n:error", "n:unreported")
        assert counts == ["1", "1"]
        # a keyed call that raised ended without returning: its replay halts
        assert coord.client.hget(KS.done(root.root_id), "call-1") == "halted"
        assert coord.client.hget(KS.by_model(root.root_id), "p|m") == "1000"


def test_a_compact_refusal_record_is_counted(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        path = Path(root.root_id, (root.root_id,))
        node = {"status": "halted", "stop_reason": "budget_exceeded"}
        event = json.dumps({"event_type": "budget_exceeded"})
        coord.store.queue_refusal(path, "budget_exceeded", event,
                                  json.dumps(node, separators=COMPACT))
        coord.store.flush()
        got = coord.client.hmget(KS.ctx(root.root_id, root.root_id),
                                 "n:refused", "nr:budget_exceeded", "nr_last", "n:halted")
        assert got == ["1", "1", "budget_exceeded", None]


def test_a_record_with_null_and_nested_fields_counts_its_own_status(
        coord: Coordinator) -> None:
    """A null stop_reason is no refusal; a status or unreported inside a nested object is
    not the call's."""
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        path = Path(root.root_id, (root.root_id,))
        ctx = KS.ctx(root.root_id, root.root_id)
        assert isinstance(coord.store.reserve(path, "call-2", ["usd", 1000, "steps", 1]),
                          Held)
        node = {"meta": {"status": "error", "unreported": True}, "stop_reason": None,
                "status": "ok"}
        assert settle(coord, path, "call-2", json.dumps(node))[0] == 1
        got = coord.client.hmget(ctx, "n:ok", "n:error", "n:refused", "n:unreported")
        assert got == ["1", None, None, None]


def test_a_flush_after_its_slice_was_charged_as_used_records_no_cost_twice(
        coord: Coordinator) -> None:
    """lease_flush.lua sets the cost of the records of a slice charged as used at its
    reclaim to 0 (the reclaim's record carries it) by decoding and encoding them again,
    whatever their separators; every other field reads back as written."""
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        path = Path(root.root_id, (root.root_id,))
        leases = LeaseStore(coord.store)
        taken = coord.store.wire.run(leases.take_op(
            path, "slice-1", "owner", 60_000, {"usd": (5000, 1), "steps": (5, 1)},
            return_on_expiry=False))
        assert int(taken[0]) == 1
        record = coord.client.hget(KS.reservations(root.root_id), "slice-1")
        assert record is not None
        leases.reclaim(root.root_id, "slice-1", ReservationRecord.from_json(record))
        coord.store.flush()
        node = {"node_id": "n1", "kind": "llm", "start_ts": 1764316800.123456,
                "end_ts": 1764316801.5, "status": "ok", "cost_usd": 0.001234,
                "input_tokens": 12, "provider": "p", "stop_reason": None}
        coord.store.wire.run(leases.flush_op(path, "slice-1", Batch(
            seq=1, nodes=[json.dumps(node, separators=COMPACT)], events=[],
            spent={"usd": 1234, "steps": 1}), give_back=False))
        stored = json.loads(coord.client.lrange(KS.nodes(root.root_id, root.root_id),
                                                -1, -1)[0])
        assert stored == {**node, "cost_usd": 0, "start_ts": pytest.approx(node["start_ts"],
                                                                           abs=1e-4)}
        NodeRecord(**stored)  # the Python reader takes what cjson wrote
