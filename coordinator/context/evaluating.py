"""``evaluate``'s two ends, for a handle's state: the limits it may tighten checked before
anything opens, and a call's outcome turned into its result or a typed error (the
Limits specification: results or exceptions instead of a Decision)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..errors import InvalidConfigError
from ..models import Decision, TokenBudget, validate_deadline
from .call import Outcome
from .reading import limit_error
from .state import ContextState


def tightens(deadline: datetime | None, token_budget: TokenBudget | None) -> bool:
    """Whether the call needs a child context that carries these limits; an invalid
    ``deadline`` raises :class:`~coordinator.errors.InvalidConfigError` (phase preflight)."""
    if deadline is None and token_budget is None:
        return False
    try:
        validate_deadline(deadline)
    except ValueError as exc:
        raise InvalidConfigError("evaluate", [
            {"loc": ("deadline",), "msg": str(exc), "input": deadline}]) from None
    return True


def result_or_raise(state: ContextState, outcome: Outcome) -> Any:
    """The call's result when it was allowed; its own error for a RETRY that failed; else
    the :class:`~coordinator.errors.PromptEvaluationError` of the stop (which reads the
    limits in force: blocking)."""
    if outcome.decision == Decision.ALLOW:
        return outcome.result
    if outcome.decision == Decision.RETRY and outcome.error is not None:
        raise outcome.error
    reason = outcome.reason or outcome.decision.value
    raise limit_error(state, reason, outcome.detail) from outcome.error
