"""The Lua scripts of the shield (circuit breaker, budget windows) and the one round trip
that runs several of them: a breaker check and a window check share a pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from .scripts import script_source

SHIELD_SCRIPTS = ("breaker_check", "breaker_record", "window")


@dataclass(frozen=True)
class ScriptCall:
    """One EVALSHA to send: the script's name, its KEYS and its ARGV."""

    name: str
    keys: list[str]
    args: list[Any]


class ShieldScripts:
    """The shield's scripts registered on one client (EVALSHA, reload on NOSCRIPT)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts: dict[str, Script] = {
            name: client.register_script(script_source(name)) for name in SHIELD_SCRIPTS
        }

    def run(self, calls: list[ScriptCall]) -> list[Any]:
        """Run ``calls`` in one pipelined round trip and return their results in order.

        A script the server does not have (NOSCRIPT: restart, SCRIPT FLUSH) did not run,
        so it is loaded and only the calls that reported it are sent again. Other errors
        are raised (connection errors as ``redis.ConnectionError``)."""
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                c = calls[i]
                pipe.evalsha(self._scripts[c.name].sha, len(c.keys), *c.keys, *c.args)
            out = pipe.execute(raise_on_error=False)
            missing = []
            for i, res in zip(todo, out, strict=True):
                if isinstance(res, redis.exceptions.NoScriptError) and attempt == 1:
                    missing.append(i)
                elif isinstance(res, Exception):
                    raise res
                else:
                    results[i] = res
            if not missing:
                break
            for name in {calls[i].name for i in missing}:
                self.client.script_load(self._scripts[name].script)
            todo = missing
        return results
