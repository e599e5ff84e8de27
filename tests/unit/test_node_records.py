"""Every node record is written by one function (models_records.encode_node) from the
fields of NodeRecord, and reads back as a NodeRecord."""

from __future__ import annotations

import json

from coordinator import NodeRecord
from coordinator.core.vocabulary import NodeStatus
from coordinator.models_records import NodeFields, encode_node


def test_the_written_fields_are_the_record_s_fields() -> None:
    keys = NodeFields.__required_keys__ | NodeFields.__optional_keys__
    assert keys == set(NodeRecord.model_fields)
    assert NodeFields.__required_keys__ == {"node_id", "kind", "start_ts", "status"}


def test_a_written_record_reads_back_with_the_keys_it_was_given() -> None:
    fields: NodeFields = {"node_id": "n1", "kind": "llm", "operation_name": "summarise",
                          "start_ts": 1_700_000_000.5, "end_ts": 1_700_000_001.0,
                          "status": NodeStatus.HALTED, "stop_reason": "budget_exceeded",
                          "stop_detail": "cost 1.0 of 1.0"}
    text = encode_node(fields)
    assert list(json.loads(text)) == list(fields)  # nothing added, nothing renamed
    record = NodeRecord.model_validate_json(text)
    assert (record.node_id, record.status, record.stop_reason) == (
        "n1", "halted", "budget_exceeded")
    assert record.cost_usd == 0.0 and record.charged_by == ""
