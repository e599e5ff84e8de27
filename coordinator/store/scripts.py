"""Loads the Lua scripts and registers them with redis-py (EVALSHA, reload on NOSCRIPT)."""

from __future__ import annotations

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


def prelude() -> str:
    """The Lua locals every script starts with: the constants shared with Python
    (coordinator/core/script_constants.py) and the vocabulary's enums and tables
    (coordinator/core/vocabulary.py), each a local of the same name, defined there once."""
    lines = ["-- constants from coordinator/core/script_constants.py"]
    lines += [f"local {name} = {_lua_literal(value)}" for name, value in LUA_CONSTANTS.items()]
    lines.append("-- words from coordinator/core/vocabulary.py")
    lines += [f"local {enum.__name__} = "
              + _lua_table({m.name: m.value for m in enum}) for enum in vocabulary.ENUMS]
    for name, table in vocabulary.TABLES.items():
        entries = dict.fromkeys(table, True) if isinstance(table, frozenset) else table
        lines.append(f"local {name} = " + _lua_table(dict(sorted(entries.items()))))
    return "\n".join(lines) + "\n"


def script_source(name: str) -> str:
    """The source registered for ``name``: the prelude of shared constants, lib.lua,
    quota_lib.lua (and data_lib.lua for the context-data scripts ``data_*``), the
    prologue binding its slots by name (store/script_slots.py), then the script itself."""
    folder = lua_dir()
    libs = ["lib.lua", "quota_lib.lua"]
    if name.startswith("data_"):
        libs.append("data_lib.lua")
    parts = [(folder / lib).read_text() for lib in libs]
    return prelude() + "\n".join([*parts, prologue(name), (folder / f"{name}.lua").read_text()])


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
