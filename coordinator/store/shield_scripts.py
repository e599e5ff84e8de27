"""The shield's scripts (circuit breaker, budget windows) as calls for the store: a
breaker check and a window check share one round trip, and each reply is decoded here,
once, into a typed result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..core.contracts import BREAKER_CHECK, BREAKER_RECORD, WINDOW_ADMIT, WINDOW_CHARGE
from .tree import Store


@dataclass(frozen=True)
class ScriptCall:
    """One EVALSHA to send: the script's name, its KEYS and its ARGV."""

    name: str
    keys: list[str]
    args: list[Any]


BreakerMode = Literal["check", "peek", "renew"]
"""breaker_check.lua's modes: a check (may take the probe), a read, the renewal of the
lease of a probe held."""


def breaker_check_call(key: str, mode: BreakerMode, holder: str, *, recovery_ms: int,
                       ttl_ms: int, lease_ms: int) -> ScriptCall:
    """breaker_check.lua's call: ``holder`` takes the probe (``check``) or renews its
    lease (``renew``); a probe whose lease of ``lease_ms`` runs out passes on."""
    return ScriptCall(BREAKER_CHECK.script, BREAKER_CHECK.key_list(breaker=key),
                      BREAKER_CHECK.arg_list(mode=mode, recovery_ms=recovery_ms, holder=holder,
                                             ttl_ms=ttl_ms, probe_lease_ms=lease_ms))


def breaker_record_call(key: str, outcome: str, holder: str, *, threshold: int,
                        ttl_ms: int) -> ScriptCall:
    """breaker_record.lua's call: the outcome of a call the breaker let through
    (``holder``: the probe it took, '' if none)."""
    return ScriptCall(BREAKER_RECORD.script, BREAKER_RECORD.key_list(breaker=key),
                      BREAKER_RECORD.arg_list(outcome=outcome, threshold=threshold,
                                              holder=holder, ttl_ms=ttl_ms))


def window_admit_call(keys: Sequence[str], call_id: str, *, window_ms: int, max_calls: int,
                      degrade_calls: int, max_usd: int, degrade_usd: int, estimate: int
                      ) -> ScriptCall:
    """window.lua's admission of ``call_id`` (``keys``: the window's calls and usd keys),
    its estimate held in the window until charged."""
    calls, usd = keys
    return ScriptCall(WINDOW_ADMIT.script, WINDOW_ADMIT.key_list(admitted=calls, spent=usd),
                      WINDOW_ADMIT.arg_list(mode="admit", window_ms=window_ms,
                                            call_id=call_id, max_calls=max_calls,
                                            degrade_calls=degrade_calls, max_usd=max_usd,
                                            degrade_usd=degrade_usd, estimate=estimate))


def window_charge_call(keys: Sequence[str], call_id: str, *, window_ms: int, held: int,
                       actual: int, max_usd: int, degrade_usd: int) -> ScriptCall:
    """window.lua's charge of what ``call_id`` cost (``held`` at its admission)."""
    calls, usd = keys
    return ScriptCall(WINDOW_CHARGE.script, WINDOW_CHARGE.key_list(admitted=calls, spent=usd),
                      WINDOW_CHARGE.arg_list(mode="charge", window_ms=window_ms,
                                             call_id=call_id, held=held, actual=actual,
                                             max_usd=max_usd, degrade_usd=degrade_usd))


@dataclass(frozen=True)
class BreakerCheck:
    """breaker_check.lua's reply: may a call go out, and the breaker's state."""

    allowed: bool
    """``check``: the call may go out; ``renew``: the holder still holds the probe."""
    state: str
    """CLOSED, OPEN or HALF_OPEN."""
    failures: int
    took_probe: bool
    """This check took the half-open probe (``renew``: the holder still holds it, its
    lease extended)."""
    wait_ms: int
    """How long until OPEN turns HALF_OPEN, or the lease of the probe held elsewhere
    runs out."""

    @property
    def holds_probe(self) -> bool:
        """The caller holds the probe after this call (taken by a check, or renewed)."""
        return self.took_probe


@dataclass(frozen=True)
class BreakerRecord:
    """breaker_record.lua's reply: the state after recording an outcome."""

    state: str
    failures: int


@dataclass(frozen=True)
class WindowCheck:
    """window.lua's reply: the window's verdict (0 ALLOW, 1 DEGRADE, 2 HALT) and its
    content after the call."""

    code: int
    calls: int
    micro_usd: int
    now_ms: int
    retry_after_ms: int


def decode_breaker_check(reply: list[Any]) -> BreakerCheck:
    allowed, state, failures, took_probe, wait_ms = reply
    return BreakerCheck(bool(int(allowed)), str(state), int(failures), bool(int(took_probe)),
                        int(wait_ms))


def decode_breaker_record(reply: list[Any]) -> BreakerRecord:
    state, failures = reply
    return BreakerRecord(str(state), int(failures))


def decode_window(reply: list[Any]) -> WindowCheck:
    code, calls, micro, now, retry = (int(x) for x in reply)
    return WindowCheck(code, calls, micro, now, retry)


DECODERS: dict[str, Callable[[list[Any]], Any]] = {
    "breaker_check": decode_breaker_check,
    "breaker_record": decode_breaker_record,
    "window": decode_window,
}


class ShieldScripts:
    """Runs shield script calls through the coordinator's store (its hot-path connection,
    EVALSHA with reload on NOSCRIPT, queued writes carried along)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def run(self, calls: list[ScriptCall]) -> list[Any]:
        """Run ``calls`` in one round trip and return their decoded replies in order
        (:class:`BreakerCheck`, :class:`BreakerRecord`, :class:`WindowCheck`); a script
        error is raised, connection errors as ``redis.ConnectionError``."""
        replies = self.store.run_scripts([(c.name, c.keys, c.args) for c in calls])
        return [DECODERS[c.name](reply) for c, reply in zip(calls, replies, strict=True)]
