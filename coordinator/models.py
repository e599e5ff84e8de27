"""The public data models: frozen, keyword-only, validated at construction.

Invalid values raise :class:`coordinator.errors.InvalidConfigError` (which is also the
Limits specification's ``PromptEvaluationError(phase="preflight")``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import FrozenModelError, InvalidConfigError


class _Frozen(BaseModel):
    """Base: frozen, no unknown fields, and validation errors raised as our typed error."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def __init__(self, *args: Any, **data: Any) -> None:
        # The specifications write these as dataclasses: fields may come by position too.
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional "
                            f"arguments ({len(args)} given)")
        for name, value in zip(names, args, strict=False):  # fewer args than fields
            if name in data:
                raise TypeError(f"{type(self).__name__} got multiple values for {name!r}")
            data[name] = value
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = [dict(e) for e in exc.errors(include_url=False, include_context=False)]
            raise InvalidConfigError(type(self).__name__, problems) from None

    # The specifications' models are frozen dataclasses, whose mutation raises
    # dataclasses.FrozenInstanceError (an AttributeError): code written for them catches it.
    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenModelError(type(self).__name__, name)

    def __delattr__(self, name: str) -> None:
        raise FrozenModelError(type(self).__name__, name)


class Decision(str, Enum):
    """What a wrap call decided. ``ALLOW`` means the function ran and completed."""

    ALLOW = "ALLOW"
    HALT = "HALT"
    RETRY = "RETRY"
    DEGRADE = "DEGRADE"


MAX_USD = 1e9
"""The largest USD amount accepted anywhere: a ceiling, an estimate, a reported cost.
In micro-USD it stays below 2**53, the integers Redis's Lua keeps exact."""
MAX_COUNT = 10**15
"""The largest count accepted anywhere: a token, step or retry limit, a token amount."""
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000
"""Ten years: the longest timeout accepted."""
MAX_LABEL = 256
"""The longest label (org, team, service, user, model, tag, operation name) accepted."""


def in_range(value: object, low: float, high: float) -> bool:
    """Whether ``value`` is a real number (not a bool) from ``low`` to ``high``: the range
    check also rejects NaN, infinities and ints too large for a float."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and low <= value <= high)


def check_usd(value: Any, name: str, *, positive: bool = False) -> float:
    """``value`` as a USD amount: a real number (not a bool or a string), finite, at least 0
    (``positive``: at least one micro-dollar, the smallest amount the ledger counts) and at
    most MAX_USD. Raises ValueError."""
    if not in_range(value, 1e-6 if positive else 0, MAX_USD):
        least = "one micro-dollar (1e-6)" if positive else "0"
        raise ValueError(f"{name} must be a number from {least} to {MAX_USD:g}")
    return float(value)


def check_count(value: Any, name: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """``value`` as an integer count (not a bool) from ``minimum`` to ``maximum``. Raises
    ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}")
    return value


def check_slug(slug: Any) -> str:
    """A provider slug: letters and digits, with ``-``, ``_`` and ``.`` (at most 64).
    Raises ValueError."""
    if not isinstance(slug, str) or not 0 < len(slug) <= 64 or not (
        slug.replace("-", "").replace("_", "").replace(".", "").isalnum() and slug.isascii()
    ):
        raise ValueError(f"provider slug {slug!r} must be 1-64 letters or digits (with - _ .)")
    return slug


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
    """The largest slice of input and of output tokens taken at once; ``None``: calls that
    reserve tokens keep strict reserves."""
    max_age_ms: int = 2000
    """A slice is returned (its spend flushed, the rest given back) at this age at most."""

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

    request_id: str
    """Unique id of this request."""
    chain_id: str
    """Logical id of the chain (agent run); unique per context."""
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


class SafetyEvent(_Frozen):
    """A normalized incident record: a chain-level stop or a pipeline decision."""

    event_type: str
    """Stop reason or policy event (``budget_exceeded``, ``aborted``, ...)."""
    decision: Decision
    """The decision that came with the event."""
    reason: str
    """Human-readable explanation with the limit and the observed value."""
    hook: str
    """Who emitted it (``ExecutionContext`` for chain-level stops)."""
    request_id: str | None = None
    """Request id of the chain that emitted it."""
    ts: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    """When it happened (UTC)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Structured details (level, limit, observed value, ...)."""


NodeKind = Literal["llm", "tool", "charge"]
NodeStatus = Literal["ok", "halted", "aborted", "timeout", "error", "lost"]


class NodeRecord(_Frozen):
    """One wrapped call."""

    node_id: str
    """Unique id of the node (also its reservation id)."""
    parent_id: str | None = None
    """The node that was running in this process when this one started, if any."""
    kind: NodeKind
    """``llm`` or ``tool``; ``charge`` for a cost charged without a call
    (``ExecutionContext.propagate_child_cost``)."""
    operation_name: str = ""
    """From ``WrapOptions.operation_name``."""
    start_ts: datetime
    """When the wrap was entered (UTC)."""
    end_ts: datetime | None = None
    """When the wrap exited (UTC)."""
    status: NodeStatus
    """``lost`` marks a call whose worker died; it was charged at its estimate."""
    cost_usd: float = 0.0
    """Actual cost charged."""
    retries_used: int = 0
    """Retries this node consumed."""
    input_tokens: int = 0
    """Input tokens charged."""
    output_tokens: int = 0
    """Output tokens charged."""
    provider: str | None = None
    """Provider slug, if known."""
    model: str | None = None
    """Model, if known."""
    stop_reason: str | None = None
    """Why the call was refused before it ran (a stop reason such as ``budget_exceeded``),
    for calls refused by a limit or a stop; the chain's events record each reason once."""
    stop_detail: str = ""
    """The refusal's detail (the limit and the amount that did not fit)."""


class TokenTotals(_Frozen):
    """Token counters of one context (subtree included)."""

    input: int = 0
    """Input tokens consumed."""
    output: int = 0
    """Output tokens consumed."""
    total: int = 0
    """Input + output tokens consumed."""
    reserved: int = 0
    """Tokens held by calls in flight (input + output)."""
    by_provider: dict[str, TokenTotals] = Field(default_factory=dict)
    """The same counters per provider slug."""


class ContextSnapshot(_Frozen):
    """An immutable copy of a context's state, read from Redis."""

    chain_id: str
    """The context's id."""
    request_id: str
    """Its request id."""
    step_count: int
    """Completed calls, subtree included."""
    cost_usd_accumulated: float
    """Settled spend, subtree included."""
    retries_used: int
    """Failed calls, subtree included."""
    aborted: bool
    """True once this context or an ancestor was stopped (any forced stop)."""
    abort_reason: str | None
    """The stop reason (``budget_exceeded``, ``aborted``, ``timeout``, ...)."""
    elapsed_ms: float
    """From creation to now, or to the stop or close."""
    nodes: list[NodeRecord]
    """The calls made in this context."""
    events: list[SafetyEvent]
    """Chain-level and pipeline events of this context."""
    parent_chain_id: str | None = None
    """The parent context's id, or None for a root."""
    root_chain_id: str = ""
    """The tree's root context id."""
    status: str = "running"
    """``running``, ``stopped`` (by a stop in this context or above) or ``closed``."""
    stopped_by: str | None = None
    """The id of the context whose stop halts this one (itself or an ancestor)."""
    max_cost_usd: float = 0.0
    """The effective cost ceiling of this context (after inheritance)."""
    max_steps: int = 0
    """The effective step limit."""
    max_retries_total: int = 0
    """The effective retry budget."""
    cost_usd_reserved: float = 0.0
    """Estimates held by calls in flight, subtree included."""
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    """Token counters, subtree included."""
    token_limits: dict[str, int] = Field(default_factory=dict)
    """Effective token limits by dimension (``total``, ``input``, ``openai.output``...)."""
    deadline: datetime | None = None
    """The effective deadline (the earliest of its own and its ancestors')."""
    clamped: list[str] = Field(default_factory=list)
    """Limits that were tightened by a parent or a budget (for example ``openai.total``)."""
    depth: int = 0
    """0 for a root."""
    metadata: ChainMetadata | None = None
    """The chain's metadata."""


class ActiveLimits(_Frozen):
    """The limits in force for running code (the Limits specification's ToolContext): the
    tightest over the context and all its ancestors, read from Redis."""

    deadline: datetime | None = None
    """The effective deadline, if any."""
    time_remaining_ms: float | None = None
    """Milliseconds left before the deadline (Redis time), if any."""
    cost_usd_remaining: float = 0.0
    """USD left under the tightest cost ceiling (estimates in flight deducted)."""
    tokens_remaining: dict[str, int] = Field(default_factory=dict)
    """Tokens left per limited dimension (``total``, ``input``, ``output``,
    ``openai.total``, ...), estimates in flight deducted."""
