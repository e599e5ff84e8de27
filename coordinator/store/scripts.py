"""Loads the Lua scripts and registers them with redis-py (EVALSHA, reload on NOSCRIPT)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from redis.commands.core import Script

from ..core import vocabulary
from ..core.contracts import CONTRACTS
from ..core.script_constants import LUA_CONSTANTS
from .script_slots import prologue
from .topology import Client

SCRIPT_NAMES = tuple(dict.fromkeys(c.script for c in CONTRACTS
                                   if not c.script.startswith("session_")))
"""The tree, shield, data, lease and quota scripts, from their contracts (the session
scripts are registered by store/sessions.py)."""


def lua_dir() -> Path:
    """The scripts' folder: inside the installed wheel, else the repository's lua/."""
    packaged = Path(str(resources.files("coordinator"))) / "lua"
    if (packaged / "reserve.lua").is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "lua"


def _lua_literal(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _lua_table(entries: dict[str, Any]) -> str:
    return "{" + ", ".join(f"[{_lua_literal(k)}] = {_lua_literal(v)}"
                           for k, v in entries.items()) + "}"


_MEMBER = re.compile(r"\b(" + "|".join(e.__name__ for e in vocabulary.ENUMS)
                     + r")\.([A-Za-z_]\w*)")
_ENUMS = {e.__name__: e for e in vocabulary.ENUMS}


def with_literals(source: str) -> str:
    """``source`` with each enum member it names written as its value
    (``ReserveCode.HELD`` -> ``1``, ``StopReason.TIMEOUT`` -> ``'timeout'``): a Lua
    constant, where a table of the enum would be built at every call of the script. A
    name the enum does not have is an error."""
    def literal(m: re.Match[str]) -> str:
        enum = _ENUMS[m.group(1)]
        if m.group(2) not in enum.__members__:
            raise ValueError(f"{m.group(1)} has no member {m.group(2)}")
        text = _lua_literal(enum.__members__[m.group(2)].value)
        # a negative in brackets: after a minus sign, '-1' would open a comment
        return f"({text})" if text.startswith("-") else text
    return _MEMBER.sub(literal, source)


def prelude(source: str | None = None) -> str:
    """The Lua locals a script starts with: the constants shared with Python
    (coordinator/core/script_constants.py) and the vocabulary's enums and tables
    (coordinator/core/vocabulary.py), each a local of the same name, defined there once.
    With ``source``, only those it names (a table is built at every call of the script:
    a script's members are literals, with_literals, so it names a table only to look a
    word up in it)."""
    def wanted(name: str) -> bool:
        return source is None or re.search(rf"\b{name}\b", source) is not None

    lines = ["-- constants from coordinator/core/script_constants.py"]
    lines += [f"local {name} = {_lua_literal(value)}" for name, value in LUA_CONSTANTS.items()
              if wanted(name)]
    lines.append("-- words from coordinator/core/vocabulary.py")
    lines += [f"local {enum.__name__} = " + _lua_table({m.name: m.value for m in enum})
              for enum in vocabulary.ENUMS if wanted(enum.__name__)]
    for name, table in vocabulary.TABLES.items():
        entries = dict.fromkeys(table, True) if isinstance(table, frozenset) else table
        if wanted(name):
            lines.append(f"local {name} = " + _lua_table(dict(sorted(entries.items()))))
    return "\n".join(lines) + "\n"


_LIST = re.compile(r"^-- (uses|needs): (.*)$", re.M)


def declared(text: str, kind: str) -> list[str]:
    """The libraries a header lists on its ``-- uses:`` (a script) or ``-- needs:`` (a
    library) lines, in order (``(none)``: none)."""
    names = ",".join(m.group(2) for m in _LIST.finditer(text) if m.group(1) == kind)
    return [n.strip() for n in names.split(",") if n.strip() not in ("", "(none)")]


def library_order(names: Sequence[str]) -> list[str]:
    """``names`` (libraries in lua/lib/) with each after the libraries it needs; a
    library whose needs are not among ``names`` is an error."""
    folder, done, out = lua_dir() / "lib", set(), []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise ValueError(f"library {name} needs itself through {' -> '.join(path)}")
        for need in declared((folder / f"{name}.lua").read_text(), "needs"):
            if need not in names:
                raise ValueError(f"library {name} needs {need}, not among {list(names)}")
            visit(need, (*path, name))
        done.add(name)
        out.append(name)

    for name in names:
        visit(name, ())
    return out


def libraries_source(names: Sequence[str]) -> str:
    """The libraries ``names`` joined in the order they need each other."""
    folder = lua_dir() / "lib"
    return "\n".join((folder / f"{name}.lua").read_text() for name in library_order(names))


def script_source(name: str) -> str:
    """The source registered for ``name``: the prelude of the shared constants and tables it
    names, the libraries its header lists on ``-- uses:`` (lua/lib/, each after those it needs), the
    prologue binding its slots by name (store/script_slots.py), then the script itself, with
    the enum members they name as literals (with_literals)."""
    text = (lua_dir() / f"{name}.lua").read_text()
    body = with_literals("\n".join([libraries_source(declared(text, "uses")), prologue(name),
                                    text]))
    return prelude(body) + body


class Scripts:
    """The registered scripts of one client.

    Direct calls go through redis-py's ``Script`` (which reloads on NOSCRIPT). Pipelined
    calls use ``evalsha`` with the same SHA; :meth:`load` re-sends them when a pipeline
    reports NOSCRIPT (redis-py's own pipeline path would add a SCRIPT EXISTS round trip
    to every pipeline).
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self.by_name: dict[str, Script] = {
            name: client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    def __getattr__(self, name: str) -> Script:
        try:
            return self.by_name[name]
        except KeyError:
            raise AttributeError(name) from None

    def load(self) -> None:
        """(Re)load every script into the server's cache."""
        for script in self.by_name.values():
            script.sha = self._client.script_load(script.script)

    def queue(self, pipe: Any, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue an EVALSHA of ``name`` on a pipeline."""
        # execute_command: a cluster pipeline blocks its evalsha method, not the command
        pipe.execute_command("EVALSHA", self.by_name[name].sha, len(keys), *keys, *args)
