"""The Lua prologue of a script, generated from its contract (core/contracts.py): every
declared KEYS and ARGV slot bound to a local of its name, so the script body reads
``reservation_id`` or ``levels[lv].ctx`` and never counts positions itself.

A fixed slot is a local holding its value (ARGV values stay strings, as Redis gives them);
a run is a local list of its groups, each group a table of its named fields
(``levels[1].ctx``), or, for a run of one field, the list of the values themselves. The
position arithmetic (slots after a run counted from the end, a run sized by its ``count``
slot) lives in this generated code only."""

from __future__ import annotations

from ..core.contracts import CONTRACTS, Contract, Part, Run, Slot

LUA_KEYWORDS = frozenset(
    "and break do else elseif end false for function if in local nil not or repeat return "
    "then true until while".split())
RESERVED = LUA_KEYWORDS | {"KEYS", "ARGV", "redis", "cjson", "cmsgpack", "bit", "struct",
                           "string", "table", "math", "type", "tonumber", "tostring", "pairs",
                           "ipairs", "next", "unpack", "pcall", "error", "select"}
"""Names a slot may not take: Lua's keywords and the globals the scripts use."""

GROUPS_HELPER = """\
-- The slots from..to of array in groups of #names fields (names nil: the values).
local function slot_groups(array, from, to, names)
  local out = {}
  if names == nil then
    for i = from, to do out[#out + 1] = array[i] end
    return out
  end
  local width = #names
  for i = from, to, width do
    local group = {}
    for j, name in ipairs(names) do group[name] = array[i + j - 1] end
    out[#out + 1] = group
  end
  return out
end
"""


def _bind(parts: tuple[Part, ...], array: str) -> list[str]:
    """Lua lines binding ``parts`` (in order) to locals, from ``array`` (KEYS or ARGV)."""
    runs = [i for i, p in enumerate(parts) if isinstance(p, Run)]
    counts = {p.counts: p.name for p in parts if isinstance(p, Slot) and p.kind == "count"}
    tail = len(parts) - 1 - runs[-1] if runs else 0
    lines: list[str] = []
    start = ""  # where the next run starts (Lua), once past the fixed head
    for i, part in enumerate(parts):
        if isinstance(part, Slot):
            if not runs or i < runs[0]:
                lines.append(f"local {part.name} = {array}[{i + 1}]")
            else:
                lines.append(f"local {part.name} = {array}[#{array}{_minus(len(parts) - 1 - i)}]")
            continue
        start = start or str(i + 1)
        width = len(part.fields)
        size = ""
        if part.name in counts:
            size = f"tonumber({counts[part.name]})" + (f" * {width}" if width > 1 else "")
            end = f"{start} + {size} - 1"
        elif i == runs[-1]:
            end = f"#{array}{_minus(tail)}"
        else:
            raise ValueError(f"run {part.name}: neither counted nor last")
        names = ("{" + ", ".join(f"'{f.name}'" for f in part.fields) + "}"
                 if width > 1 else "nil")
        lines.append(f"local {part.name} = slot_groups({array}, {start}, {end}, {names})")
        start = f"{start} + {size}"
    return lines


def _minus(n: int) -> str:
    return f" - {n}" if n else ""


def _names(parts: tuple[Part, ...]) -> list[str]:
    return [p.name for p in parts]


def contracts_of(script: str) -> list[Contract]:
    """The contracts of ``script`` (one per mode for a script whose ARGV differ by mode)."""
    found = [c for c in CONTRACTS if c.script == script]
    if not found:
        raise KeyError(f"no contract declared for {script}.lua")
    return found


def slot_names(script: str) -> list[str]:
    """The names the prologue of ``script`` binds: its KEYS', then its ARGV's of every
    mode (a name two modes share is bound once: at the same slot in both)."""
    contracts = contracts_of(script)
    names = _names(contracts[0].keys)
    for c in contracts:
        names += [n for n in _names(c.argv) if n not in names]
    return names


def prologue(script: str) -> str:
    """The Lua lines binding each slot of ``script``'s contract to a local of its name."""
    contracts = contracts_of(script)
    if any(c.keys != contracts[0].keys for c in contracts):
        raise ValueError(f"{script}: its modes declare different KEYS")
    lines = [f"-- slots of {script}.lua, from coordinator/core/contracts.py"]
    lines += _bind(contracts[0].keys, "KEYS")
    bound: dict[str, str] = {}
    for c in contracts:
        for line in _bind(c.argv, "ARGV"):
            name = line.split()[1]
            if bound.setdefault(name, line) != line:
                raise ValueError(f"{script}: ARGV {name} sits at two slots by mode")
    lines += bound.values()
    names = _names(contracts[0].keys) + list(bound)
    clash = {n for n in names if names.count(n) > 1} | (set(names) & RESERVED)
    if clash:
        raise ValueError(f"{script}: slot names {sorted(clash)} clash")
    if any(" slot_groups(" in line for line in lines):
        lines.insert(1, GROUPS_HELPER.rstrip("\n"))
    return "\n".join(lines) + "\n"
