"""Each script's header comment lists the KEYS and ARGV its contract declares
(coordinator/core/contracts.py), by name and in order; the builders put the values where
the script reads them; and the scripts read them by name only, through the prologue
generated from the same declaration (store/script_slots.py). No Redis needed."""

from __future__ import annotations

import re

import pytest

from coordinator.core.contracts import (
    CONTRACTS,
    LEASE_FLUSH,
    LEASE_RETURN,
    RELEASE,
    SETTLE,
    Contract,
    Part,
    Run,
)
from coordinator.store import sessions
from coordinator.store.script_slots import prologue, slot_names
from coordinator.store.scripts import SCRIPT_NAMES, lua_dir

_SLOT = re.compile(r"^--\s+(KEYS|ARGV)\[([^\]]+)\]\s+(\w+)(?:\{([\w, ]+)\})?(?:\s|$)")
_SECTION = re.compile(r"^--\s+(\w+):$")

Listed = tuple[str, str, tuple[str, ...]]  # (slot as written, name, fields of a run)


def header(script: str) -> dict[tuple[str, str], list[Listed]]:
    """(section, KEYS | ARGV) -> the slots the header lists; section '' is the part
    common to every mode, another is the section of the header named so."""
    out: dict[tuple[str, str], list[Listed]] = {}
    section = ""
    for line in (lua_dir() / f"{script}.lua").read_text().splitlines():
        if not line.startswith("--"):
            break
        if m := _SECTION.match(line):
            section = m.group(1)
        elif m := _SLOT.match(line):
            which, spec, name, fields = m.groups()
            runs = tuple(f.strip() for f in fields.split(",")) if fields else ()
            out.setdefault((section, which), []).append((spec, name, runs))
    return out


def declared(parts: tuple[Part, ...]) -> list[tuple[str, tuple[str, ...]]]:
    return [(p.name, tuple(f.name for f in p.fields) if isinstance(p, Run) else ())
            for p in parts]


def check_positions(script: str, which: str, parts: tuple[Part, ...],
                    listed: list[Listed]) -> None:
    """Fixed slots are numbered from 1, the first run is written ``n..``; what follows a
    run is counted from the end (``last``, ``last-1``...) or named in words."""
    first_run = next((i for i, p in enumerate(parts) if isinstance(p, Run)), len(parts))
    for i, (spec, name, _) in enumerate(listed):
        if i < first_run:
            assert spec == str(i + 1), f"{script} {which} {name}: written [{spec}]"
        elif i == first_run:
            assert spec == f"{i + 1}..", f"{script} {which} {name}: written [{spec}]"
        elif spec.startswith("last"):
            back = len(parts) - 1 - i
            assert spec.replace(" ", "") == ("last" if back == 0 else f"last-{back}"), (
                f"{script} {which} {name}: written [{spec}], {back} from the end")
        else:
            assert not spec.isdigit(), f"{script} {which} {name}: [{spec}] after a run"


def test_every_script_is_declared() -> None:
    # the loaders register what CONTRACTS declares: every script file must be among it
    scripts = {lua.stem for lua in lua_dir().glob("*.lua")}
    assert {c.script for c in CONTRACTS} == scripts == {*SCRIPT_NAMES, *sessions.SCRIPT_NAMES}


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: f"{c.script}.{c.variant}")
def test_header_lists_the_declared_slots(contract: Contract) -> None:
    listed = header(contract.script)
    for which, parts in (("KEYS", contract.keys), ("ARGV", contract.argv)):
        slots = listed.get(("", which), []) + (
            listed.get((contract.variant, which), []) if contract.variant else [])
        assert [(name, runs) for _, name, runs in slots] == declared(parts), (
            f"{contract.script}.lua's {which}")
        check_positions(contract.script, which, parts, slots)


def test_a_script_with_modes_declares_each() -> None:
    for script in (*SCRIPT_NAMES, *sessions.SCRIPT_NAMES):
        sections = {s for s, _ in header(script)} - {""}
        assert sections == {c.variant for c in CONTRACTS if c.script == script} - {""}


def test_builders_put_values_in_the_declared_order() -> None:
    args = RELEASE.arg_list(reservation_id="r", abort_channel="a", node="", node_cap=5,
                            ledger_channel="l", outcome="skip", late=False, node_status="",
                            node_stop_reason="", node_unreported=False, node_model="",
                            amounts=("usd", 3))
    assert args == ["r", "a", "", 5, "l", "skip", "0", "", "", "0", "", "usd", 3]
    assert args[RELEASE.slot("late")] == "0"
    assert SETTLE.slot("late") == 5  # ARGV[6] in settle.lua, counted from 0 here
    keys = SETTLE.key_list(res="R", leases="L", nodes="N", ledger="G",
                           levels=("c1", "e1", "c2", "e2"), fin="F", done="D", bymodel="M")
    assert keys == ["R", "L", "N", "G", "c1", "e1", "c2", "e2", "F", "D", "M"]


def test_builders_refuse_what_the_contract_does_not_declare() -> None:
    values = {"reservation_id": "r", "abort_channel": "a", "node": "", "node_cap": 5,
              "ledger_channel": "l", "late": False, "amounts": ("usd", 3), "node_status": "",
              "node_stop_reason": "", "node_unreported": False, "node_model": ""}
    with pytest.raises(TypeError, match="outcome"):
        RELEASE.arg_list(**values)
    with pytest.raises(TypeError, match="outcome"):
        SETTLE.arg_list(**values, outcome="ok")
    with pytest.raises(TypeError, match="groups of 2"):
        SETTLE.arg_list(**{**values, "amounts": ("usd",)})
    with pytest.raises(KeyError):
        SETTLE.slot("amounts")


def test_settle_and_release_take_the_same_keys() -> None:
    # store/tree.py builds them once per path for both
    assert SETTLE.keys == RELEASE.keys


def test_a_slice_flush_and_its_reclaim_take_the_same_keys() -> None:
    # store/leases_store.py builds them in one place for both
    assert LEASE_FLUSH.keys == LEASE_RETURN.keys


def _code(text: str) -> str:
    """Lua source without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_scripts_read_named_slots_not_positions() -> None:
    # the slot prologue (store/script_slots.py) is the only code that indexes KEYS or ARGV
    for lua in sorted(lua_dir().rglob("*.lua")):
        code = _code(lua.read_text())
        assert not re.search(r"\b(KEYS|ARGV)\b", code), f"{lua.name} reads KEYS or ARGV"


@pytest.mark.parametrize("script", sorted({c.script for c in CONTRACTS}))
def test_the_prologue_binds_every_declared_name(script: str) -> None:
    bound = re.findall(r"^local (\w+) = (?:KEYS|ARGV|slot_groups)", prologue(script), re.M)
    assert bound == slot_names(script)
    declared_names = {p.name for c in CONTRACTS if c.script == script
                      for p in (*c.keys, *c.argv)}
    assert set(bound) == declared_names
