"""Loads the Lua scripts and registers them with redis-py (EVALSHA, reload on NOSCRIPT)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

SCRIPT_NAMES = ("open", "reserve", "settle", "release", "abort", "close", "renew",
                "breaker_check", "breaker_record", "window",
                "data_read", "data_write", "data_merge", "data_spawn", "data_snapshot")


def lua_dir() -> Path:
    """The scripts' folder: inside the installed wheel, else the repository's lua/."""
    packaged = Path(str(resources.files("coordinator"))) / "lua"
    if (packaged / "reserve.lua").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


def script_source(name: str) -> str:
    """The source registered for ``name``: lib.lua (and data_lib.lua for the context-data
    scripts) followed by the script itself."""
    folder = lua_dir()
    lib = (folder / "lib.lua").read_text()
    if name.startswith("data_"):
        lib += "\n" + (folder / "data_lib.lua").read_text()
    return lib + "\n" + (folder / f"{name}.lua").read_text()


class Scripts:
    """The registered scripts of one client.

    Direct calls go through redis-py's ``Script`` (which reloads on NOSCRIPT). Pipelined
    calls use ``evalsha`` with the same SHA; :meth:`load` re-sends them when a pipeline
    reports NOSCRIPT (redis-py's own pipeline path would add a SCRIPT EXISTS round trip
    to every pipeline).
    """

    def __init__(self, client: redis.Redis) -> None:
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
        pipe.evalsha(self.by_name[name].sha, len(keys), *keys, *args)
