"""The records read back: a call's node, a chain's events and snapshot, the limits in
force, and the Decision a wrap call returns; and the one writer of a node record
(:func:`encode_node`), and what settle and release count of it (:func:`node_facts`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal, TypedDict

from pydantic import Field

from .core import vocabulary
from .core.vocabulary import CallCount
from .models_base import _Frozen
from .models_config import ChainMetadata


class Decision(str, Enum):
    """What a wrap call decided. ``ALLOW`` means the function ran and completed."""

    ALLOW = "ALLOW"
    HALT = "HALT"
    RETRY = "RETRY"
    DEGRADE = "DEGRADE"


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
    """Model, if known: the model that ran."""
    degraded_from: str | None = None
    """The model the call asked for, when its model ladder ran it on ``model`` instead
    (docs/degrade.md)."""
    stop_reason: str | None = None
    """Why the call was refused before it ran (a stop reason such as ``budget_exceeded``),
    for calls refused by a limit or a stop; the chain's events record each reason once."""
    stop_detail: str = ""
    """The refusal's detail (the limit and the amount that did not fit)."""
    steps_used: int = 0
    """1 when the call counted a step (it returned, or raised a non-retryable error)."""
    error_type: str | None = None
    """The exception type of a call that raised."""
    error_message: str = ""
    """Its message (truncated to 500 characters)."""
    charged_by: str = ""
    """The charging rule applied (``reported``, ``priced``, ``estimate``, ``floor``,
    ``fallback_price``, ``none``; docs/tokens.md)."""
    unreported: bool = False
    """An LLM call that returned with no report and no estimate: charged the floor."""


class _NodeKeys(TypedDict):
    """The fields every node record has."""

    node_id: str
    kind: NodeKind
    start_ts: float
    status: vocabulary.NodeStatus


class NodeFields(_NodeKeys, total=False):
    """A node record as it is written: :class:`NodeRecord`'s fields, its times in seconds
    since the epoch. A field left out reads back as NodeRecord's default, so each writer
    gives only what it knows (the stored keys stay as they were)."""

    parent_id: str | None
    operation_name: str
    end_ts: float
    cost_usd: float
    retries_used: int
    input_tokens: int
    output_tokens: int
    provider: str | None
    model: str | None
    degraded_from: str
    stop_reason: str | None
    stop_detail: str
    steps_used: int
    error_type: str | None
    error_message: str
    charged_by: str
    unreported: bool


def encode_node(fields: NodeFields) -> str:
    """The stored form of a node record: JSON that :class:`NodeRecord` reads back and the
    scripts decode with cjson (lua/lib/records.lua). Every node record is written by it."""
    return json.dumps(fields)


def node_facts(fields: NodeFields | None) -> dict[str, str | bool]:
    """What settle.lua and release.lua count of a node record, sent next to its JSON so
    that they never decode it (lua/lib/calls_counted.lua node_facts reads the same of a
    decoded record): ``status`` and ``stop_reason`` ('' unless a non-empty string),
    ``unreported`` (only when it is ``True``), and the ``'<provider>|<model>'`` its spend
    is counted by ('-' for a part not named; '' when neither is)."""
    got: Mapping[str, object] = fields or {}

    def text(name: str) -> str:
        value = got.get(name)
        return value if isinstance(value, str) else ""

    provider, model = text("provider"), text("model")
    return {"node_status": text("status"), "node_stop_reason": text("stop_reason"),
            "node_unreported": got.get("unreported") is True,
            "node_model": f"{provider or '-'}|{model or '-'}" if provider or model else ""}


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
    """The calls made in this context (the newest, under the node cap), in the order
    they finished."""
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
    calls: dict[str, int] = Field(default_factory=dict)
    """Calls by outcome, nonzero only, counted in Redis by the scripts that settle them:
    ``ok``, ``error``, ``interrupted``, ``halted`` (subtree included) and ``refused``
    (this context's own)."""
    refusals: dict[str, int] = Field(default_factory=dict)
    """This context's refused calls by reason (``budget_exceeded``, ...)."""
    last_refusal: str | None = None
    """The reason of the latest refusal here."""
    unreported_calls: int = 0
    """This context's LLM calls charged the floor for reporting nothing."""
    degraded_calls: int = 0
    """Calls its model ladder ran on a cheaper model than they asked for, subtree
    included (each node's ``degraded_from``; docs/degrade.md)."""

    @property
    def calls_run(self) -> int:
        """Calls whose function ran (all but the refused), subtree included."""
        return sum(n for k, n in self.calls.items() if k != CallCount.REFUSED)


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
    cost_fraction_remaining: float | None = None
    """What is left of the tightest USD ceiling (the one ``cost_usd_remaining`` is
    under), as a fraction of it, from 0.0 to 1.0; None when no level has one."""


class BudgetWarning(_Frozen):
    """A level's spend or steps reached one of its ``ExecutionConfig.warn_at``
    thresholds: what ``ExecutionContext.on_warning`` callbacks are called with (once per
    handle, level, dimension and threshold)."""

    chain_id: str
    """The level (context id) whose ceiling the threshold is a fraction of: the handle's
    own context or one of its ancestors."""
    threshold: float
    """The fraction reached (as stored: parts per million)."""
    dimension: Literal["usd", "steps"]
    """``usd`` (spend against ``max_cost_usd``) or ``steps`` (against ``max_steps``)."""
    remaining_usd: float | None = None
    """USD left under the level's ceiling when it was reached (None: no USD ceiling)."""
    remaining_steps: int | None = None
    """Steps left under the level's ceiling then (None: no step ceiling)."""


class CallInfo(_Frozen):
    """The wrapped call running here, as ``current_call()`` reads it."""

    call_id: str
    """Its id (its node's id)."""
    kind: str
    """``llm`` or ``tool``."""
    model: str | None
    """The model it runs on: the one its model ladder chose (docs/degrade.md), else the
    one ``WrapOptions.model`` named. A hand-wrapped call sends this one."""
    requested_model: str | None
    """The model ``WrapOptions.model`` named."""
    degraded: bool
    """Whether the ladder chose a model other than the requested one."""
    final: bool
    """Whether it may spend the final reserve (``WrapOptions.final``, ``finishing()``)."""
