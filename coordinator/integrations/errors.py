"""The error a budgeted request raises when its context refuses it (or stops it midway),
and its SDK-flavoured twins that the provider SDKs pass through without retrying."""

from __future__ import annotations

from typing import Any

from ..errors import BudgetCoordinatorError
from ..models import ContextSnapshot, Decision


class BudgetExceededError(BudgetCoordinatorError):
    """A request was refused before it was sent (``decision`` HALT/DEGRADE/RETRY), or
    stopped while it ran (``reason`` ``aborted``/``timeout``), by the context's limits.

    ``reason`` is the stop reason (``budget_exceeded``, ``max_steps_exceeded``,
    ``aborted``, ``provider_error``...), ``snapshot`` the context's state when it was
    raised (None when Redis could not be read)."""

    def __init__(self, *, decision: Decision, reason: str, detail: str, chain_id: str,
                 snapshot: ContextSnapshot | None) -> None:
        self.decision = decision
        self.reason = reason
        self.detail = detail
        self.chain_id = chain_id
        self.snapshot = snapshot
        spent = (f"; spent ${snapshot.cost_usd_accumulated:.6f} of "
                 f"${snapshot.max_cost_usd:.6f}" if snapshot is not None else "")
        super().__init__(f"context {chain_id} refused the request ({decision.value}, "
                         f"{reason}): {detail or reason}{spent}")

    sdk_error: type[Exception] | None = None
    """The SDK base error this class also is (see :func:`flavoured`)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # by the SDK base: a flavoured class is made at run time, not found by its name
        fields = {k: getattr(self, k) for k in ("decision", "reason", "detail", "chain_id",
                                                "snapshot")}
        return (_rebuild, (self.sdk_error, fields))


def _rebuild(sdk_error: type[Exception] | None, fields: dict[str, Any]
             ) -> BudgetExceededError:
    cls = BudgetExceededError if sdk_error is None else flavoured(sdk_error)
    return cls(**fields)


_FLAVOURED: dict[type[Exception], type[BudgetExceededError]] = {}


def flavoured(sdk_error: type[Exception]) -> type[BudgetExceededError]:
    """``BudgetExceededError`` that is also ``sdk_error`` (``openai.OpenAIError``,
    ``anthropic.AnthropicError``): both SDKs re-raise their own errors from the transport
    as they are, where any other exception would be wrapped in a connection error and
    retried."""
    cls = _FLAVOURED.get(sdk_error)
    if cls is None:
        name = f"{sdk_error.__name__.removesuffix('Error')}BudgetExceededError"
        cls = _FLAVOURED.setdefault(sdk_error, type(
            name, (BudgetExceededError, sdk_error),
            {"__module__": __name__, "sdk_error": sdk_error}))
    return cls
