"""Every script's slot prologue (store/script_slots.py) binds each name to the value the
store's builder put under that name (core/contracts.py): one declaration on both sides
of the seam, checked by running the prologue in Redis for every contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from coordinator.core.contracts import CONTRACTS, Contract, Part, Run, Slot
from coordinator.store.script_slots import prologue

_SAMPLE: dict[str, Any] = {"key": "k", "str": "s", "int": 7, "json": '{"a": 1}',
                           "csv": "a,b", "flag": True}
_SENT = {"flag": "1"}


def _values(parts: tuple[Part, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for a builder, and what the script should see under each name
    (strings, as Redis hands ARGV to Lua; runs as groups, a run of one field as values)."""
    given: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    for part in parts:
        if isinstance(part, Run):
            groups = [{f.name: f"{part.name}.{n}.{f.name}" if f.kind != "int" else 10 + n
                       for f in part.fields} for n in range(2 + len(part.fields) % 2)]
            given[part.name] = [g[f.name] for g in groups for f in part.fields]
            seen[part.name] = ([{k: str(v) for k, v in g.items()} for g in groups]
                               if len(part.fields) > 1
                               else [str(g[part.fields[0].name]) for g in groups])
    for part in parts:
        if isinstance(part, Slot) and part.kind == "count":
            seen[part.name] = str(len(seen[part.counts]))
        elif isinstance(part, Slot):
            given[part.name] = f"{part.name}:{_SAMPLE[part.kind]}"
            if part.kind in ("int", "flag"):
                given[part.name] = _SAMPLE[part.kind]
            seen[part.name] = _SENT.get(part.kind, str(given[part.name]))
    return given, seen


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: f"{c.script}.{c.variant}")
def test_the_script_sees_each_value_under_its_declared_name(contract: Contract,
                                                             redis_url: str) -> None:
    key_kw, key_seen = _values(contract.keys)
    arg_kw, arg_seen = _values(contract.argv)
    expected = {**key_seen, **arg_seen}
    source = prologue(contract.script) + "return cjson.encode({" + ", ".join(
        f"{name} = {name}" for name in expected) + "})"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys, args = contract.key_list(**key_kw), contract.arg_list(**arg_kw)
    assert json.loads(client.eval(source, len(keys), *keys, *args)) == expected
