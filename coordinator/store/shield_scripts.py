"""The shield's scripts (circuit breaker, budget windows) as calls for the store: a
breaker check and a window check share one round trip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .tree import Store


@dataclass(frozen=True)
class ScriptCall:
    """One EVALSHA to send: the script's name, its KEYS and its ARGV."""

    name: str
    keys: list[str]
    args: list[Any]


class ShieldScripts:
    """Runs shield script calls through the coordinator's store (its hot-path connection,
    EVALSHA with reload on NOSCRIPT, queued writes carried along)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def run(self, calls: list[ScriptCall]) -> list[Any]:
        """Run ``calls`` in one round trip and return their results in order; a script
        error is raised, connection errors as ``redis.ConnectionError``."""
        return self.store.run_scripts([(c.name, c.keys, c.args) for c in calls])
