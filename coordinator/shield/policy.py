"""The circuit breaker's check interface (ExecutionContext specification, section 7)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyContext:
    """What a policy check sees before a call is dispatched."""

    cost_usd: float = 0.0
    step_count: int = 0


@dataclass(frozen=True)
class PolicyDecision:
    """``allowed`` False stops the call; ``reason`` says why."""

    allowed: bool
    reason: str = ""
