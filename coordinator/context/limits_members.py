"""ContextLimitsMembers: the ExecutionContext facade's members of the Limits
specification: ``evaluate`` (results or a typed error instead of a Decision), the limits
in force and the token ledger."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import InvalidConfigError
from ..models import ActiveLimits, Decision, TokenBudget, WrapOptions, validate_deadline
from .call import Outcome
from .lease_registry import flush_lease
from .ledger import TokenLedger
from .reading import active_limits, limit_error
from .state import ContextState
from .wrap import run_sync

if TYPE_CHECKING:
    from typing_extensions import Self


class ContextLimitsMembers:
    """Mixed into ExecutionContext: evaluate, limits, ledger."""

    _state: ContextState
    if TYPE_CHECKING:  # provided by ExecutionContext
        spawn_child: Callable[..., Any]

        def close(self) -> None: ...

    def evaluate(self, fn: Callable[[], Any], options: WrapOptions | None = None, *,
                 deadline: datetime | None = None,
                 token_budget: TokenBudget | None = None) -> Any:
        """The exception-style twin of :meth:`wrap_llm_call`: returns ``fn``'s result, or
        raises :class:`~coordinator.errors.PromptEvaluationError` with ``phase`` set to
        ``preflight`` (invalid limits), ``deadline``, ``token_budget``, or ``halted`` (with
        the stop reason) for every other stop. A failure of ``fn`` itself is re-raised.
        ``deadline`` and ``token_budget`` tighten this context's limits for this call and
        everything it spawns (the call runs in a child context that carries them)."""
        target = self._tightened(deadline, token_budget)
        try:
            outcome = run_sync(target._state, target, "llm", fn, options)
        finally:
            if target is not self:
                target.close()
        return target._result_or_raise(outcome)

    def _tightened(self, deadline: datetime | None, token_budget: TokenBudget | None
                   ) -> Self:
        if deadline is None and token_budget is None:
            return self
        try:
            validate_deadline(deadline)
        except ValueError as exc:
            raise InvalidConfigError("evaluate", [
                {"loc": ("deadline",), "msg": str(exc), "input": deadline}]) from None
        child: Self = self.spawn_child(deadline=deadline, token_budget=token_budget)
        return child

    def _result_or_raise(self, outcome: Outcome) -> Any:
        if outcome.decision == Decision.ALLOW:
            return outcome.result
        if outcome.decision == Decision.RETRY and outcome.error is not None:
            raise outcome.error
        reason = outcome.reason or outcome.decision.value
        raise limit_error(self._state, reason, outcome.detail) from outcome.error

    def limits(self) -> ActiveLimits:
        """The limits in force here: the tightest over this context and its ancestors."""
        flush_lease(self._state)
        return active_limits(self._state)

    @property
    def ledger(self) -> TokenLedger:
        """This context's :class:`~coordinator.context.ledger.TokenLedger`."""
        return TokenLedger(self._state)

