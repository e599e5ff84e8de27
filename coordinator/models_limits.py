"""An operator's change of a running context's limits (``Coordinator.set_limits``): what
is asked (:class:`LimitsRequest`, validated as every limit is) and what it did
(:class:`LimitsChange`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from .core.amounts import TOKEN_DIMS, micro_to_usd, token_limit_dims, usd_to_micro
from .models_base import MAX_LABEL, _Frozen, check_count, check_usd
from .models_config import TokenBudget

MAX_REASON = 1000
"""The longest reason accepted (as ``budgetctl abort`` keeps its reason)."""

_NAMES = {"usd": "max_cost_usd", "steps": "max_steps", "retries": "max_retries_total"}


def limit_name(dim: str) -> str:
    """The name a person reads for a limit's dimension in Redis: ``max_cost_usd``,
    ``max_steps``, ``max_retries_total``, ``token_budget.total``,
    ``token_budget.openai.output``."""
    if dim in _NAMES:
        return _NAMES[dim]
    slug, _, base = dim.rpartition(".")
    return f"token_budget.{slug}.{TOKEN_DIMS[base]}" if slug else f"token_budget.{TOKEN_DIMS[base]}"


class LimitsRequest(_Frozen):
    """New limits for one context: each one given replaces the context's own (``None``
    leaves it as it is; a token budget's dimensions left ``None`` too). Values are checked
    as ExecutionConfig checks them (a USD amount from one micro-dollar to MAX_USD, counts
    from 1): anything else raises InvalidConfigError before Redis is asked."""

    max_cost_usd: float | None = None
    """The new USD ceiling."""
    max_steps: int | None = None
    """The new step limit."""
    max_retries_total: int | None = None
    """The new retry budget."""
    token_budget: TokenBudget | None = None
    """New token limits: the dimensions it gives (total, input, output, a provider's)."""
    actor: str = Field(min_length=1, max_length=MAX_LABEL)
    """Who changes them (kept in the limits_changed event)."""
    reason: str = Field(default="", max_length=MAX_REASON)
    """Why (kept in the limits_changed event)."""

    @field_validator("max_cost_usd", mode="before")
    @classmethod
    def _cost(cls, v: Any) -> float | None:
        return v if v is None else check_usd(v, "max_cost_usd", positive=True)

    @field_validator("max_steps", "max_retries_total", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return v if v is None else check_count(v, "a step or retry limit", minimum=1)

    @model_validator(mode="after")
    def _something(self) -> LimitsRequest:
        if not self.dims():
            raise ValueError("no limit to change: give max_cost_usd, max_steps, "
                             "max_retries_total or a token_budget with a limit")
        return self

    def dims(self) -> list[tuple[str, int]]:
        """The new limits as Redis keeps them: (dimension, integer), USD in micro-USD."""
        out: list[tuple[str, int]] = []
        if self.max_cost_usd is not None:
            out.append(("usd", usd_to_micro(self.max_cost_usd)))
        if self.max_steps is not None:
            out.append(("steps", self.max_steps))
        if self.max_retries_total is not None:
            out.append(("retries", self.max_retries_total))
        tokens, _ = token_limit_dims(self.token_budget)
        out.extend(tokens.items())
        return out


class LimitChange(_Frozen):
    """One limit before and after a change."""

    limit: str
    """Its name (:func:`limit_name`): ``max_cost_usd``, ``max_steps``,
    ``max_retries_total``, ``token_budget.total``, ``token_budget.openai.output``..."""
    before: float | int | None
    """The context's own limit before (USD for ``max_cost_usd``); None: it had none."""
    after: float | int
    """The limit now."""

    @classmethod
    def of(cls, dim: str, before: int | None, after: int) -> LimitChange:
        """A change of dimension ``dim`` as Redis keeps it (USD in micro-USD)."""
        if dim == "usd":
            return cls(limit=limit_name(dim),
                       before=None if before is None else micro_to_usd(before),
                       after=micro_to_usd(after))
        return cls(limit=limit_name(dim), before=before, after=after)


class LimitsChange(_Frozen):
    """What ``set_limits`` did, recorded as the context's limits_changed SafetyEvent."""

    ctx_id: str
    """The context whose limits changed."""
    actor: str
    """Who changed them."""
    reason: str
    """Why."""
    changes: tuple[LimitChange, ...]
    """Each limit given, before and after (in the order of the call's arguments)."""
    lifted: tuple[str, ...] = ()
    """The stop reasons lifted at the context (``budget_exceeded``...): it runs again,
    and so does its subtree unless something else stops it."""
    stopped: bool = False
    """Whether the context is stopped after the change (a lowering at or below what is
    spent stops it; a stop that was not lifted stays)."""
    stop_reason: str | None = None
    """The reason it is stopped for, if it is."""
