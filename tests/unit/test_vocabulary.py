"""The words Python and the scripts share (core/vocabulary.py) are one set of enums: each
reads as its value wherever Python writes it (JSON, f-strings, Redis), and the prelude
gives a script the same names as Lua tables. No Redis needed."""

from __future__ import annotations

import json

from coordinator.core.vocabulary import (
    CALL_COUNTS,
    ENDED_WITHOUT_RETURN,
    ENUMS,
    CallCount,
    NodeStatus,
    StopReason,
)
from coordinator.store.scripts import prelude, script_source


def test_a_word_reads_as_its_value() -> None:
    assert f"{StopReason.TIMEOUT}" == str(StopReason.TIMEOUT) == "timeout"
    assert json.dumps({"reason": StopReason.STATE_CORRUPT}) == '{"reason": "state_corrupt"}'
    stored: str = "aborted"  # as Redis hands it back
    assert stored == StopReason.ABORTED and stored in {StopReason.ABORTED}


def test_every_node_status_is_counted_in_a_class() -> None:
    assert set(CALL_COUNTS) == set(NodeStatus)
    assert set(CALL_COUNTS.values()) == set(CallCount) - {CallCount.REFUSED}
    assert NodeStatus.LOST not in ENDED_WITHOUT_RETURN  # a reaped call's replay goes on


def test_the_prelude_names_each_word_as_python_does() -> None:
    text = prelude()
    for enum in ENUMS:
        for member in enum:
            assert f"['{member.name}'] = {member.value!r}" in text or (
                f"['{member.name}'] = {member.value}" in text), (enum.__name__, member)
    # a script gets the tables it names, and only those (each is built at every call)
    assert "local ReserveCode" in script_source("reserve")
    assert "local ReserveCode" not in script_source("append")
