"""BudgetWindowHook: a sliding-window limit on calls and USD per scope (an org, a team, a
service, a user or a model), shared by every process through Redis."""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from ..core.amounts import micro_to_usd, usd_to_micro
from ..core.vocabulary import StopReason
from ..errors import InvalidConfigError
from ..models import MAX_COUNT, MAX_USD, Decision, in_range
from ..runtime.coordinator import Coordinator
from ..store.errors import UNAVAILABLE
from ..store.shield_scripts import (
    ShieldScripts,
    WindowCheck,
    window_admit_call,
    window_charge_call,
)
from .breaker import CircuitBreaker
from .hooks import RecordingHook
from .pipeline import ShieldPipeline, ToolCallContext

log = logging.getLogger("coordinator")

SCOPES = {"org": "org_id", "team": "team", "service": "service", "user": "user_id",
          "model": "model"}
"""Scope name -> the ToolCallContext field (from ChainMetadata) whose value is limited."""
NO_VALUE = "-"
"""The bucket shared by calls whose metadata has no value for the scope."""
_CODES = {0: Decision.ALLOW, 1: Decision.DEGRADE, 2: Decision.HALT}
MAX_WINDOW_S = 30 * 24 * 3600
"""The longest window accepted: 30 days."""


@dataclass(frozen=True)
class WindowVerdict:
    """The outcome of one admission to a window."""

    decision: Decision
    """ALLOW, DEGRADE (admitted, past the degrade fraction) or HALT (not admitted)."""
    scope_value: str
    """The scope's value the call was counted under (``-`` when the metadata has none)."""
    calls: int
    """Calls in the window after this one (before it, on HALT)."""
    usd: float
    """USD in the window (estimates until charged with the actual cost)."""
    redis_ms: int
    """Redis time of the admission."""
    retry_after_ms: int
    """On HALT: when the oldest call leaves the window."""


def _escape(value: str) -> str:
    # Braces would break the key's hash tag, '%' keeps the escape unambiguous.
    return value.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class BudgetWindowHook(RecordingHook):
    """Limits the calls (``max_calls``) and the USD (``max_usd``) of one scope within the
    last ``window_s`` seconds (0.001 to 30 days), across every process. Returns DEGRADE
    (the call is counted) when the calls already in the window, before this one, number at
    least ``degrade_at`` x ``max_calls``, or when its USD with this call's estimate is past
    ``degrade_at`` of ``max_usd``; HALT at the limit (the call is not counted).

    ``max_usd`` holds each call's ``cost_estimate_usd`` at admission and replaces it with
    the actual cost in ``before_charge``. Give ``circuit_breaker=`` to fetch its check in the
    same round trip as the window's (ExecutionContext then finds it ready).
    Created with ``pipeline=``, the hook joins that pipeline and records a SafetyEvent
    ``provider_rate_limit`` for each HALT (``budget_window_degrade`` for DEGRADE).
    """

    def __init__(
        self,
        *,
        scope: str = "org",
        max_calls: int | None = None,
        max_usd: float | None = None,
        window_s: float = 60.0,
        degrade_at: float = 0.8,
        kinds: tuple[str, ...] = ("llm",),
        name: str = "default",
        circuit_breaker: CircuitBreaker | None = None,
        pipeline: ShieldPipeline | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        problems = _validate(scope, max_calls, max_usd, window_s, degrade_at, kinds, name)
        for loc, value, cls in (("circuit_breaker", circuit_breaker, CircuitBreaker),
                                ("pipeline", pipeline, ShieldPipeline),
                                ("coordinator", coordinator, Coordinator)):
            if value is not None and not isinstance(value, cls):
                problems.append({"loc": (loc,), "msg": f"must be a {cls.__name__} or None",
                                 "input": value})
        if problems:
            raise InvalidConfigError("BudgetWindowHook", problems)
        self.scope = scope
        self.max_calls = max_calls
        self.max_usd = max_usd
        self.window_s = float(window_s)
        self.degrade_at = float(degrade_at)
        self.kinds = tuple(kinds)
        self.name = name
        self.circuit_breaker = circuit_breaker
        self._window_ms = max(1, round(window_s * 1000))
        self._max_calls = max_calls or 0
        # A call degrades when the calls before it number at least degrade_at x max_calls.
        self._degrade_calls = math.ceil(self._max_calls * self.degrade_at - 1e-9)
        self._max_micro = usd_to_micro(max_usd) if max_usd is not None else 0
        self._degrade_micro = math.floor(self._max_micro * self.degrade_at + 1e-9)
        self._coord = coordinator or Coordinator.default()
        self.scripts = ShieldScripts(self._coord.store)
        super().__init__(pipeline)

    def __repr__(self) -> str:
        return (f"BudgetWindowHook(scope={self.scope!r}, max_calls={self.max_calls}, "
                f"max_usd={self.max_usd}, window_s={self.window_s}, "
                f"degrade_at={self.degrade_at})")

    # -- keys ----------------------------------------------------------------------------

    def scope_value(self, ctx: ToolCallContext) -> str:
        """The value of this hook's scope for a call (``-`` when the metadata has none)."""
        value = getattr(ctx, SCOPES[self.scope])
        return str(value) if value else NO_VALUE

    def keys(self, value: str) -> list[str]:
        """The window's keys for one scope value (one hash tag: one cluster slot)."""
        tag = f"win:{self.name}:{self.scope}:{_escape(value)}"
        prefix = self._coord.keyspace.prefix
        return [f"{prefix}:{{{tag}}}:calls", f"{prefix}:{{{tag}}}:usd"]

    # -- admission -----------------------------------------------------------------------

    def admit(self, ctx: ToolCallContext) -> WindowVerdict:
        """Check-and-add one call to its scope's window (one atomic script, one round trip
        shared with the circuit breaker's check when one is attached)."""
        value = self.scope_value(ctx)
        estimate = usd_to_micro(ctx.cost_estimate_usd, round_up=True) if self._max_micro else 0
        calls = [window_admit_call(
            self.keys(value), ctx.node_id, window_ms=self._window_ms, max_calls=self._max_calls,
            degrade_calls=self._degrade_calls, max_usd=self._max_micro,
            degrade_usd=self._degrade_micro, estimate=estimate)]
        breaker = self._breaker_sharing_round_trip()
        holder = uuid.uuid4().hex
        if breaker is not None:
            calls.append(breaker.check_call(holder))
        replies = self.scripts.run(calls)
        verdict = _verdict(value, replies[0])
        if breaker is not None:
            decision = breaker.accept(holder, replies[1])
            if verdict.decision == Decision.ALLOW:
                breaker.prefetch(decision)
            elif decision.allowed:
                # No call follows a refused (or degraded, under ExecutionContext) window:
                # free a probe taken in the same round trip.
                breaker.release()
        return verdict

    def _breaker_sharing_round_trip(self) -> CircuitBreaker | None:
        b = self.circuit_breaker
        return b if b is not None and b.scripts.store is self.scripts.store else None

    def _before(self, ctx: ToolCallContext) -> Decision | None:
        if ctx.kind not in self.kinds:
            return None
        try:
            v = self.admit(ctx)
        except UNAVAILABLE as exc:
            self._emit(ctx, StopReason.BACKEND_UNAVAILABLE, Decision.HALT,
                       f"budget window unavailable: Redis unreachable ({exc})")
            return Decision.HALT
        if v.decision == Decision.HALT:
            self._emit(ctx, "provider_rate_limit", Decision.HALT, self._describe(v, "reached"),
                       **self._meta(v))
            return Decision.HALT
        if v.decision == Decision.DEGRADE:
            self._emit(ctx, "budget_window_degrade", Decision.DEGRADE,
                       self._describe(v, f"is past {self.degrade_at:.0%} of"), **self._meta(v))
            return Decision.DEGRADE
        return None

    def before_llm_call(self, ctx: ToolCallContext) -> Decision | None:
        """Admit an LLM call to the window (if ``llm`` is in ``kinds``)."""
        return self._before(ctx)

    def before_tool_call(self, ctx: ToolCallContext) -> Decision | None:
        """Admit a tool call to the window (if ``tool`` is in ``kinds``)."""
        return self._before(ctx)

    def before_charge(self, ctx: ToolCallContext, cost_usd: float) -> Decision | None:
        """Replace the call's estimate in the USD window with its actual cost (no round
        trip without ``max_usd`` or when they are equal). DEGRADE when the window is now
        past ``degrade_at`` of ``max_usd``. (ExecutionContext asks it of LLM calls; a tool
        call's cost comes through :meth:`on_charge`.)"""
        v = self.on_charge(ctx, cost_usd)
        if v is None or v.decision == Decision.ALLOW:
            return None
        self._emit(ctx, "budget_window_degrade", Decision.DEGRADE,
                   self._describe(v, f"is past {self.degrade_at:.0%} of"), **self._meta(v))
        return Decision.DEGRADE

    def on_charge(self, ctx: ToolCallContext, cost_usd: float) -> WindowVerdict | None:
        """Replace the call's estimate in the USD window with its actual cost; the
        window's state after it (None when nothing was sent)."""
        if not self._max_micro or ctx.kind not in self.kinds:
            return None
        held = usd_to_micro(ctx.cost_estimate_usd, round_up=True)
        actual = usd_to_micro(cost_usd)
        if held == actual:
            return None
        value = self.scope_value(ctx)
        try:
            reply = self.scripts.run([window_charge_call(
                self.keys(value), ctx.node_id, window_ms=self._window_ms, held=held,
                actual=actual, max_usd=self._max_micro, degrade_usd=self._degrade_micro)])[0]
        except UNAVAILABLE as exc:
            log.warning("budget window %s: could not charge %s (%s)", self.name, ctx.node_id,
                        exc)
            return None
        return _verdict(value, reply)

    def _describe(self, v: WindowVerdict, verb: str) -> str:
        limits = []
        if self.max_calls:
            limits.append(f"{v.calls} calls (max_calls {self.max_calls})")
        if self.max_usd is not None:
            limits.append(f"${v.usd:.6f} (max_usd {self.max_usd})")
        return (f"{self.scope} {v.scope_value!r}: the {self.window_s:g} s window {verb} its "
                f"limit: {', '.join(limits)}")

    def _meta(self, v: WindowVerdict) -> dict[str, Any]:
        return {"scope": self.scope, "scope_value": v.scope_value, "window_calls": v.calls,
                "window_usd": v.usd, "retry_after_ms": v.retry_after_ms}


def _verdict(value: str, reply: WindowCheck) -> WindowVerdict:
    return WindowVerdict(_CODES[reply.code], value, reply.calls, micro_to_usd(reply.micro_usd),
                         reply.now_ms, reply.retry_after_ms)


def _validate(scope: object, max_calls: object, max_usd: object, window_s: object,
              degrade_at: object, kinds: object, name: object) -> list[dict[str, Any]]:
    """Every problem of a window configuration (empty when it is valid)."""
    problems: list[dict[str, Any]] = []

    def bad(loc: str, msg: str, value: object) -> None:
        problems.append({"loc": (loc,), "msg": msg, "input": value})

    if not isinstance(scope, str) or scope not in SCOPES:
        bad("scope", f"must be one of {', '.join(SCOPES)}", scope)
    if max_calls is None and max_usd is None:
        bad("max_calls", "give max_calls, max_usd or both", max_calls)
    if max_calls is not None and (not isinstance(max_calls, int)
                                  or not in_range(max_calls, 1, MAX_COUNT)):
        bad("max_calls", f"must be an integer from 1 to {MAX_COUNT:.0e}", max_calls)
    if max_usd is not None and not in_range(max_usd, 0.000001, MAX_USD):
        bad("max_usd", f"must be an amount from 0.000001 to {MAX_USD:.0e}", max_usd)
    if not in_range(window_s, 0.001, MAX_WINDOW_S):
        bad("window_s", f"must be a number of seconds from 0.001 to {MAX_WINDOW_S} "
                        f"(30 days)", window_s)
    if not in_range(degrade_at, 0, 1) or degrade_at == 0:
        bad("degrade_at", "must be in (0, 1]", degrade_at)
    if (not isinstance(kinds, tuple) or not kinds
            or any(k not in ("llm", "tool") for k in kinds)):
        bad("kinds", "must be a non-empty tuple of 'llm' and 'tool'", kinds)
    if (not isinstance(name, str) or not name or len(name) > 100 or "{" in name
            or "}" in name or not name.isprintable()):
        bad("name", "must be 1-100 printable characters without { }", name)
    return problems

