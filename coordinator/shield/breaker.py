"""CircuitBreaker: one breaker per provider (or provider and model) shared by every process
that names it. Its state lives in Redis, so failures in one worker open it for the whole
fleet, and exactly one process at a time gets the HALF_OPEN probe call."""

from __future__ import annotations

import logging
import threading
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import InvalidConfigError
from ..models import MAX_COUNT, in_range
from ..runtime.coordinator import Coordinator
from ..store.errors import UNAVAILABLE
from ..store.shield_scripts import (
    BreakerCheck,
    BreakerMode,
    ScriptCall,
    ShieldScripts,
    breaker_check_call,
    breaker_record_call,
)
from .policy import PolicyContext, PolicyDecision

log = logging.getLogger("coordinator")

# An untouched breaker's state expires after a day (its recovery timeout is added).
IDLE_TTL_MS = 24 * 3600 * 1000
MAX_RECOVERY_S = 24 * 3600
"""The longest recovery timeout accepted: a day."""
MIN_PROBE_LEASE_S = 0.05
"""The shortest probe lease accepted (renewed every third of it)."""


class BreakerState(str, Enum):
    """The three states of a circuit breaker."""

    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@dataclass(frozen=True)
class _Ticket:
    """What this caller's last check saw: the probe it holds (if any) and the failures."""

    holder: str | None
    failures: int


def _validate(name: object, failure_threshold: object, recovery_timeout_s: object,
              probe_lease_s: object, coordinator: object) -> list[dict[str, Any]]:
    """Every problem of a breaker configuration (empty when it is valid)."""
    problems: list[dict[str, Any]] = []

    def bad(loc: str, msg: str, value: object) -> None:
        problems.append({"loc": (loc,), "msg": msg, "input": value})

    if (not isinstance(name, str) or not name or len(name) > 200 or "{" in name
            or "}" in name or not name.isprintable()):
        bad("name", "must be 1-200 printable characters without { }", name)
    if not isinstance(failure_threshold, int) or not in_range(failure_threshold, 1, MAX_COUNT):
        bad("failure_threshold", f"must be an integer from 1 to {MAX_COUNT:.0e}",
            failure_threshold)
    if not in_range(recovery_timeout_s, 0.001, MAX_RECOVERY_S):
        bad("recovery_timeout_s", f"must be a number of seconds from 0.001 to "
                                  f"{MAX_RECOVERY_S} (1 day)", recovery_timeout_s)
    if probe_lease_s is not None and not in_range(probe_lease_s, MIN_PROBE_LEASE_S,
                                                  MAX_RECOVERY_S):
        bad("probe_lease_s", f"must be None or a number of seconds from {MIN_PROBE_LEASE_S} "
                             f"to {MAX_RECOVERY_S} (1 day)", probe_lease_s)
    if coordinator is not None and not isinstance(coordinator, Coordinator):
        bad("coordinator", "must be a Coordinator or None", coordinator)
    return problems


class CircuitBreaker:
    """A circuit breaker whose state is shared through Redis.

    ``CLOSED``: calls go through; ``failure_threshold`` consecutive failures (fleet-wide)
    open it. ``OPEN``: every check is refused until ``recovery_timeout_s`` (at most a day)
    has passed (Redis time). ``HALF_OPEN``: one check in the whole fleet gets the probe;
    its success closes the breaker for everyone, its failure opens it again. The probe is
    held until its holder reports, however long the call runs: the holder's process renews
    a liveness lease of ``probe_lease_s`` (default: ``recovery_timeout_s``, at least 1 s)
    in the background; a probe whose holder died passes to the next caller once that lease
    has run out (and a late outcome of a lapsed probe still counts).

    The probe taken by :meth:`check` is resolved by the :meth:`record_success` or
    :meth:`record_failure` made in the same thread or asyncio task, as ExecutionContext does.
    """

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        recovery_timeout_s: float = 30.0,
        probe_lease_s: float | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        problems = _validate(name, failure_threshold, recovery_timeout_s, probe_lease_s,
                             coordinator)
        if problems:
            raise InvalidConfigError("CircuitBreaker", problems)
        self.name = name
        self.failure_threshold = failure_threshold
        self.recovery_timeout_s = float(recovery_timeout_s)
        self.probe_lease_s = float(probe_lease_s if probe_lease_s is not None
                                   else max(1.0, recovery_timeout_s))
        self._recovery_ms = max(1, round(recovery_timeout_s * 1000))
        self._lease_ms = round(self.probe_lease_s * 1000)
        # Probes this process holds, whose lease a background timer renews.
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._coord = coordinator or Coordinator.default()
        self.key = f"{self._coord.keyspace.prefix}:{{brk:{name}}}:state"
        self.scripts = ShieldScripts(self._coord.store)
        # Per thread / asyncio task: what the last check saw, and a verdict fetched ahead
        # of check() in the same round trip as a window hook's check.
        self._ticket: ContextVar[_Ticket | None] = ContextVar(f"brk-ticket:{name}",
                                                              default=None)
        self._prefetched: ContextVar[PolicyDecision | None] = ContextVar(
            f"brk-prefetch:{name}", default=None)

    def __repr__(self) -> str:
        return (f"CircuitBreaker({self.name!r}, failure_threshold={self.failure_threshold}, "
                f"recovery_timeout_s={self.recovery_timeout_s}, "
                f"probe_lease_s={self.probe_lease_s})")

    # -- checks --------------------------------------------------------------------------

    def check(self, context: PolicyContext | None = None) -> PolicyDecision:
        """May a call go out now? Refused while OPEN, and while HALF_OPEN with the probe
        taken by another caller; the first caller after the recovery timeout takes the
        probe. Fails closed: refused when Redis cannot be reached."""
        prefetched = self._prefetched.get()
        if prefetched is not None:
            self._prefetched.set(None)
            return prefetched
        holder = uuid.uuid4().hex
        try:
            reply: BreakerCheck = self.scripts.run([self.check_call(holder)])[0]
        except UNAVAILABLE as exc:
            self._ticket.set(None)
            return PolicyDecision(False, f"circuit breaker {self.name!r}: Redis unavailable "
                                         f"({exc})")
        return self.accept(holder, reply)

    def check_call(self, holder: str) -> ScriptCall:
        """The script call of a check taking the probe for ``holder`` (to share a round
        trip; pass its result to :meth:`accept`)."""
        return self._check_call("check", holder)

    def _check_call(self, mode: BreakerMode, holder: str) -> ScriptCall:
        return breaker_check_call(self.key, mode, holder, recovery_ms=self._recovery_ms,
                                  ttl_ms=IDLE_TTL_MS + self._recovery_ms,
                                  lease_ms=self._lease_ms)

    def accept(self, holder: str, reply: BreakerCheck) -> PolicyDecision:
        """Turn a check's script reply into the decision, remembering a probe taken
        (and renewing its lease until it is resolved)."""
        self._ticket.set(_Ticket(holder if reply.took_probe else None, reply.failures))
        if reply.took_probe:
            with self._held_lock:
                self._held.add(holder)
            self._schedule_renewal(holder)
        if reply.allowed:
            reason = "half-open probe" if reply.took_probe else ""
            return PolicyDecision(True, reason)
        if reply.state == BreakerState.OPEN.value:
            reason = (f"circuit breaker {self.name!r} is OPEN ({reply.failures} consecutive "
                      f"failures); retry in {reply.wait_ms} ms")
        else:
            reason = (f"circuit breaker {self.name!r} is HALF_OPEN and its probe call is "
                      f"in flight elsewhere")
        return PolicyDecision(False, reason)

    def prefetch(self, decision: PolicyDecision) -> None:
        """Hand the next :meth:`check` in this thread/task a decision fetched in another
        round trip (a window hook's)."""
        self._prefetched.set(decision)

    # -- outcomes ------------------------------------------------------------------------

    def record_success(self) -> None:
        """The call let through succeeded: a probe's success closes the breaker for
        everyone; in CLOSED it resets the consecutive-failure count. Costs no round trip
        when the last check saw CLOSED with no failures (nothing would change)."""
        ticket = self._ticket.get()
        self._ticket.set(None)
        if ticket is not None and ticket.holder is None and ticket.failures == 0:
            return
        self._record("success", ticket)

    def record_failure(self) -> None:
        """The call let through failed: counts toward opening the breaker; a failed probe
        opens it again for another recovery timeout."""
        ticket = self._ticket.get()
        self._ticket.set(None)
        self._record("failure", ticket)

    def release(self) -> None:
        """The call let through by the last check never ran: free the probe it took (if
        any) for another caller."""
        ticket = self._ticket.get()
        self._ticket.set(None)
        self._prefetched.set(None)
        if ticket is not None and ticket.holder is not None:
            self._record("release", ticket)

    # -- the probe's lease ---------------------------------------------------------------

    def _schedule_renewal(self, holder: str) -> None:
        self._coord.call_later(self.probe_lease_s / 3, lambda: self._renew(holder))

    def _renew(self, holder: str) -> None:
        """Extend the lease of a probe this process still runs (on the coordinator's timer
        thread); stops once the probe is resolved here or no longer held."""
        with self._held_lock:
            if holder not in self._held:
                return
        try:
            reply: BreakerCheck = self.scripts.run([self._check_call("renew", holder)])[0]
            held = reply.holds_probe
        except UNAVAILABLE as exc:
            log.warning("circuit breaker %r: could not renew the probe's lease (%s)",
                        self.name, exc)
            held = True  # try again: the probe is still ours until its lease runs out
        if not held:  # resolved meanwhile, or its lease lapsed: nothing left to renew
            with self._held_lock:
                self._held.discard(holder)
            return
        self._schedule_renewal(holder)

    def _record(self, outcome: str, ticket: _Ticket | None) -> None:
        holder = ticket.holder if ticket is not None and ticket.holder else ""
        if holder:
            with self._held_lock:
                self._held.discard(holder)
        call = breaker_record_call(self.key, outcome, holder, threshold=self.failure_threshold,
                                   ttl_ms=IDLE_TTL_MS + self._recovery_ms)
        try:
            self.scripts.run([call])
        except UNAVAILABLE as exc:
            # The outcome is lost; a probe held here is freed by its expiry.
            log.warning("circuit breaker %r: could not record %s (%s)", self.name, outcome, exc)

    # -- state ---------------------------------------------------------------------------

    def _peek(self) -> BreakerCheck:
        reply: BreakerCheck = self.scripts.run([self._check_call("peek", "")])[0]
        return reply

    @property
    def state(self) -> BreakerState:
        """The state now, as every process sees it (HALF_OPEN once the recovery timeout
        has passed, before anyone took the probe)."""
        return BreakerState(self._peek().state)

    @property
    def failure_count(self) -> int:
        """Consecutive failures recorded since the breaker last closed."""
        return self._peek().failures
