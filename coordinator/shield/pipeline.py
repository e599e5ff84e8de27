"""ShieldPipeline: per-call policy hooks that an ExecutionContext consults after its own
limits (the ExecutionContext specification, section 7)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..models import Decision, SafetyEvent


@dataclass(frozen=True)
class ToolCallContext:
    """What a hook sees of one call."""

    request_id: str
    chain_id: str
    node_id: str
    kind: str
    operation_name: str = ""
    cost_estimate_usd: float = 0.0
    provider: str | None = None
    model: str | None = None
    org_id: str = ""
    team: str = ""
    service: str = ""
    user_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    step_count: int = 0
    """Steps completed in the context before this call (as last seen by this process)."""


MAX_EVENTS = 1000
"""Events a pipeline keeps (the newest; the reference's cap). Contexts copy each event into
their chain's log in Redis as it comes, so none is lost to the cap there."""


class ShieldPipeline:
    """An ordered list of hooks. The first non-ALLOW decision wins and is recorded as a
    SafetyEvent (hooks may also record their own through :meth:`record`)."""

    def __init__(self, *hooks: Any) -> None:
        self.hooks: list[Any] = []
        self._events: deque[SafetyEvent] = deque(maxlen=MAX_EVENTS)
        self._recorded = 0  # events ever recorded: a position for events_since
        self._lock = threading.Lock()
        for hook in hooks:
            self.add_hook(hook)

    def add_hook(self, hook: Any) -> None:
        """Append a hook; a hook that records its own events (``joined``) records them
        here, however it was attached: one refusal, one event type (docs/shield.md)."""
        self.hooks.append(hook)
        joined = getattr(hook, "joined", None)
        if joined is not None:
            joined(self)

    def record(self, event: SafetyEvent) -> None:
        with self._lock:
            self._events.append(event)
            self._recorded += 1

    def get_events(self) -> list[SafetyEvent]:
        """The events the pipeline recorded, oldest first: the last MAX_EVENTS (1000)."""
        with self._lock:
            return list(self._events)

    def events_since(self, position: int) -> tuple[list[SafetyEvent], int]:
        """The events recorded after ``position`` (0: since the start; at most the
        MAX_EVENTS kept) and the position after them, without copying the others."""
        with self._lock:
            new = min(self._recorded - position, len(self._events))
            if new <= 0:
                return [], self._recorded
            n = len(self._events)
            return [self._events[i] for i in range(n - new, n)], self._recorded

    def _consult(self, method: str, ctx: ToolCallContext, *args: Any) -> Decision:
        for hook in self.hooks:
            fn = getattr(hook, method, None)
            if fn is None:
                continue
            decision = fn(ctx, *args)
            if decision is not None and decision != Decision.ALLOW:
                if not getattr(hook, "records_own_events", False):
                    self.record(SafetyEvent(
                        event_type=f"{method}_{decision.value.lower()}",
                        decision=decision,
                        reason=f"{type(hook).__name__}.{method} returned {decision.value}",
                        hook=type(hook).__name__,
                        request_id=ctx.request_id,
                        metadata={"chain_id": ctx.chain_id, "node_id": ctx.node_id},
                    ))
                return Decision(decision)
        return Decision.ALLOW

    def before_llm_call(self, ctx: ToolCallContext) -> Decision:
        return self._consult("before_llm_call", ctx)

    def before_tool_call(self, ctx: ToolCallContext) -> Decision:
        return self._consult("before_tool_call", ctx)

    def before_egress(self, ctx: ToolCallContext, url: str) -> Decision:
        return self._consult("before_egress", ctx, url)

    def before_charge(self, ctx: ToolCallContext, cost_usd: float) -> Decision:
        return self._consult("before_charge", ctx, cost_usd)

    def charged(self, ctx: ToolCallContext, cost_usd: float) -> None:
        """Tell the hooks' ``on_charge`` the actual cost of a call that ``before_charge``
        does not judge (tool calls): no decision."""
        for hook in self.hooks:
            fn = getattr(hook, "on_charge", None)
            if fn is not None:
                fn(ctx, cost_usd)

    def on_error(self, ctx: ToolCallContext, error: BaseException) -> Decision:
        """The first hook's non-ALLOW decision, else RETRY."""
        decision = self._consult("on_error", ctx, error)
        return Decision.RETRY if decision == Decision.ALLOW else decision
