"""The configuration models: a chain's limits (ExecutionConfig, TokenBudget, LeasePolicy),
its labels (ChainMetadata) and a call's options (WrapOptions)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from pydantic import Field, field_validator, model_validator

from .models_base import (
    MAX_LABEL,
    MAX_TIMEOUT_MS,
    _Frozen,
    check_count,
    check_slug,
    check_usd,
    in_range,
)
from .models_degrade import Degrade, check_warn_at


class TokenBudget(_Frozen):
    """Token limits for a context and everything it spawns (the Limits specification).

    A dimension left ``None`` is unbounded while the others stay active.
    """

    total: int | None = None
    """Combined input + output tokens."""
    input: int | None = None
    """Request-side tokens."""
    output: int | None = None
    """Response-side tokens."""
    provider_shares: Mapping[str, TokenBudget] | None = None
    """Per-provider limits keyed by provider slug (``"openai"``, ``"anthropic"``, ...)."""

    @field_validator("total", "input", "output", mode="before")
    @classmethod
    def _positive_int(cls, v: Any) -> Any:
        return v if v is None else check_count(v, "a token limit", minimum=1)

    @field_validator("provider_shares")
    @classmethod
    def _slugs(cls, v: Mapping[str, TokenBudget] | None) -> Mapping[str, TokenBudget] | None:
        if v is None:
            return v
        for slug, share in v.items():
            check_slug(slug)
            if share.provider_shares:
                raise ValueError(f"provider share {slug!r} cannot nest further shares")
        return dict(v)

    @model_validator(mode="after")
    def _consistent(self) -> TokenBudget:
        if self.total is not None:
            for name in ("input", "output"):
                part = getattr(self, name)
                if part is not None and self.total < part:
                    raise ValueError(f"total ({self.total}) is smaller than {name} ({part})")
        return self


class LeasePolicy(_Frozen):
    """Lease mode (opt-in): this process takes a slice of the budget from Redis in one
    atomic step (held at every level like a reservation), serves calls from it locally and
    writes their spend behind in batches. See docs/leases.md for what it relaxes."""

    usd: float = 0.05
    """The largest slice of USD taken at once (smaller near a ceiling)."""
    steps: int = 100
    """The largest slice of steps taken at once."""
    tokens: int | None = None
    """The largest slice of input and of output tokens (overall and per provider) taken at
    once; ``None``: calls that reserve tokens keep strict reserves."""
    max_age_ms: int = 2000
    """A slice is returned (its spend flushed, the rest given back) at this age at most."""
    return_on_expiry: bool = False
    """Relaxes the ceiling: when this process dies, its slice's unflushed part is given
    back (as if its calls never ran) instead of charged as used (docs/leases.md)."""

    @field_validator("usd", mode="before")
    @classmethod
    def _usd(cls, v: Any) -> float:
        return check_usd(v, "lease usd", positive=True)

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, v: Any) -> Any:
        return check_count(v, "lease steps", minimum=1)

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, v: Any) -> Any:
        return v if v is None else check_count(v, "lease tokens", minimum=1)

    @field_validator("max_age_ms", mode="before")
    @classmethod
    def _age(cls, v: Any) -> Any:
        return check_count(v, "lease max_age_ms", minimum=1, maximum=MAX_TIMEOUT_MS)


class ExecutionConfig(_Frozen):
    """Hard limits for one chain. A context's limits bound its whole subtree."""

    max_cost_usd: float
    """USD ceiling for this context and all its descendants."""
    max_steps: int
    """Maximum number of completed wrap calls (subtree included)."""
    max_retries_total: int
    """Chain-wide retry budget (failed calls, subtree included)."""
    timeout_ms: int = 0
    """Wall-clock timeout from the context's creation, in Redis time (0 = none)."""
    token_budget: TokenBudget | None = None
    """Token limits; ``None`` means no token limit."""
    deadline: datetime | None = None
    """Absolute, timezone-aware deadline; the earlier of this and ``timeout_ms`` wins."""
    lease: LeasePolicy | None = None
    """Lease mode for this context's calls (``None``: strict reserves). Children inherit it
    unless they say otherwise."""
    approval_wait_s: float | None = None
    """How long a call that meets a ceiling (or does not fit under one) waits for an
    operator to raise the limit before it halts, in seconds (``None``: it halts at once).
    Children inherit it (docs/operators.md, "Wait for approval")."""
    degrade: Degrade | None = None
    """Model ladders: calls fall back to cheaper models as money runs low instead of
    halting (docs/degrade.md). Children inherit it unless they say otherwise."""
    final_reserve_usd: float = 0.0
    """USD at the top of this context's ceiling that only calls marked final
    (``WrapOptions(final=True)``, ``ctx.finishing()``) may spend; an ordinary call that
    would reach into it halts with ``final_reserve`` and the context keeps running."""
    warn_at: tuple[float, ...] = ()
    """Fractions of this context's ceilings (USD, steps) at which one ``budget_warning``
    is recorded and every process under it hears it (``ctx.on_warning``)."""

    @field_validator("max_cost_usd", mode="before")
    @classmethod
    def _cost(cls, v: Any) -> float:
        return check_usd(v, "max_cost_usd", positive=True)

    @field_validator("max_steps", "max_retries_total", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return check_count(v, "a step or retry limit", minimum=1)

    @field_validator("timeout_ms", mode="before")
    @classmethod
    def _timeout(cls, v: Any) -> Any:
        return check_count(v, "timeout_ms (0 = none)", maximum=MAX_TIMEOUT_MS)

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: Any) -> datetime | None:
        return validate_deadline(v)

    @field_validator("final_reserve_usd", mode="before")
    @classmethod
    def _reserve(cls, v: Any) -> float:
        return check_usd(v, "final_reserve_usd")

    @field_validator("warn_at", mode="before")
    @classmethod
    def _warn_at(cls, v: Any) -> tuple[float, ...]:
        return check_warn_at(v)

    @model_validator(mode="after")
    def _reserve_below_ceiling(self) -> ExecutionConfig:
        if self.final_reserve_usd >= self.max_cost_usd:
            raise ValueError(f"final_reserve_usd ({self.final_reserve_usd}) must be below "
                             f"max_cost_usd ({self.max_cost_usd})")
        return self

    @field_validator("approval_wait_s", mode="before")
    @classmethod
    def _approval_wait(cls, v: Any) -> float | None:
        if v is not None and not in_range(v, 0.001, MAX_TIMEOUT_MS / 1000):
            raise ValueError(f"approval_wait_s must be a number of seconds from 0.001 to "
                             f"{MAX_TIMEOUT_MS // 1000} (None = no wait)")
        return v if v is None else float(v)


def validate_deadline(v: Any) -> datetime | None:
    """Reject a naive deadline, or one in the past or within the current second."""
    if v is None:
        return v
    if not isinstance(v, datetime):
        raise ValueError(f"deadline must be a datetime; got {v!r}")
    if v.tzinfo is None or v.utcoffset() is None:
        raise ValueError("deadline must be timezone-aware")
    if v.timestamp() - time.time() < 1.0:
        raise ValueError("deadline lies in the past or within the current second")
    return v.astimezone(timezone.utc)


class ChainMetadata(_Frozen):
    """Immutable descriptor of a chain; labels for dashboards and window hooks."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id of this request (a new one when not given)."""
    chain_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """Logical id of the chain (agent run); unique per context (a new one when not given)."""
    org_id: str = Field(default="", max_length=MAX_LABEL)
    """Organisation (tenant) id."""
    team: str = Field(default="", max_length=MAX_LABEL)
    """Team or cost centre."""
    service: str = Field(default="", max_length=MAX_LABEL)
    """Service or agent name."""
    user_id: str | None = Field(default=None, max_length=MAX_LABEL)
    """End-user id, if known."""
    model: str | None = Field(default=None, max_length=MAX_LABEL)
    """Primary model name, if known."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Arbitrary key/value labels (at most 64, each key and value at most 256 characters)."""
    plan_id: str | None = Field(default=None, max_length=MAX_LABEL)
    """The plan this chain executes (CCOS ``HostPlanContext``), for the causal chain."""
    intent_ids: tuple[str, ...] = Field(default=(), max_length=64)
    """The intents the plan serves (CCOS ``HostPlanContext``)."""
    parent_action_id: str | None = Field(default=None, max_length=MAX_LABEL)
    """The causal-chain action that started this chain (CCOS ``HostPlanContext``)."""

    @field_validator("chain_id", "request_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not v or len(v) > 128 or any(c in v for c in ",{}\x00") or not v.isprintable():
            raise ValueError("ids must be 1-128 printable characters without , { }")
        return v

    @field_validator("intent_ids")
    @classmethod
    def _intents(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(len(x) > MAX_LABEL for x in v):
            raise ValueError(f"intent ids must be at most {MAX_LABEL} characters")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 64 or any(len(k) > MAX_LABEL or len(x) > MAX_LABEL for k, x in v.items()):
            raise ValueError(f"at most 64 tags, keys and values of at most {MAX_LABEL} "
                             f"characters")
        return v


class WrapOptions(_Frozen):
    """Per-call options."""

    operation_name: str = Field(default="", max_length=MAX_LABEL)
    """Human-readable label for the node."""
    cost_estimate_hint: float = 0.0
    """Estimated USD cost, reserved before the call at every level of the tree."""
    timeout_ms: int | None = None
    """Per-call timeout; the call's cancellation token fires when it elapses."""
    retry_policy_override: int | None = None
    """Retries for this call only: the wrap re-runs a failing function up to this many
    times (each retry counts against the chain-wide retry budget)."""
    provider: str | None = None
    """Provider slug for token budgets (``"openai"``, ``"anthropic"``, ...)."""
    model: str | None = None
    """Model name, for pricing reported token usage."""
    input_tokens_estimate: int | None = None
    """Projected input tokens, reserved before the call."""
    max_output_tokens: int | None = None
    """The call's ``max_tokens``: output tokens reserved before the call (worst case)."""
    tags: tuple[str, ...] = Field(default=(), max_length=64)
    """Tags the tool declares (e.g. ``needs-context``): an ``ExposurePolicy`` may let
    tools with a tag see the context data."""
    retry_on: tuple[type[Exception], ...] | None = None
    """The exception types that count as retryable failures (a retry spent); any other
    is raised at once and its run counts as a step. None: every exception but a caller
    bug (docs/tokens.md) is retryable."""

    final: bool = False
    """A call that may spend its context's final reserve (``final_reserve_usd``): the
    agent's last answer. ``ctx.finishing()`` marks every call in its block."""

    @field_validator("cost_estimate_hint", mode="before")
    @classmethod
    def _hint(cls, v: Any) -> float:
        return check_usd(v, "cost_estimate_hint")

    @field_validator("timeout_ms", mode="before")
    @classmethod
    def _call_timeout(cls, v: Any) -> Any:
        return v if v is None else check_count(v, "timeout_ms", maximum=MAX_TIMEOUT_MS)

    @field_validator("retry_policy_override", "input_tokens_estimate", "max_output_tokens",
                     mode="before")
    @classmethod
    def _non_negative(cls, v: Any) -> Any:
        return v if v is None else check_count(v, "a count")

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, v: Any) -> Any:
        return v if v is None else check_slug(v)

    @field_validator("tags")
    @classmethod
    def _capability_tags(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(len(t) > MAX_LABEL for t in v):
            raise ValueError(f"tags must be at most {MAX_LABEL} characters")
        return v

