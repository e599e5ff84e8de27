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
from coordinator.store.scripts import SCRIPT_NAMES, prelude, script_source


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
    # a script gets the enum members it names as literals and only the tables it looks
    # words up in (each table is built at every call)
    reserve = script_source("reserve")
    assert "return {1, now, " in reserve and "ReserveCode" not in reserve
    assert "local CALL_COUNTS" in script_source("settle")
    assert "local CALL_COUNTS" not in script_source("append")
    assert not any(f"local {enum.__name__} =" in script_source(name)
                   for enum in ENUMS for name in SCRIPT_NAMES)
