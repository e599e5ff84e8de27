"""Distributed budget coordinator: one ceiling for a whole tree of LLM agents, wherever
they run. State lives in Redis; atomic Lua scripts reserve, settle and roll spend up to
every ancestor."""

from .context.cancellation import CancellationToken, CancelledByContext
from .context.execution import (
    ExecutionContext,
    current_call,
    current_cancellation_token,
    current_context,
    current_limits,
)
from .context.ledger import LedgerReservation, TokenLedger
from .context.streaming import ametered_stream, metered_stream
from .core.pricing import model_price, set_price
from .core.usage import report_usage
from .data.branches import merge_children, run_parallel
from .data.context_data import ContextData
from .data.exposure import current_data_view
from .data.model import ExposurePolicy, IsolationLevel, MergePolicy, MergeResult
from .errors import (
    DeadlineExceededError,
    PromptEvaluationError,
    TokenBudgetExceededError,
)
from .models import (
    ActiveLimits,
    BudgetWarning,
    CallInfo,
    ChainMetadata,
    ContextSnapshot,
    Decision,
    Degrade,
    ExecutionConfig,
    LeasePolicy,
    NodeRecord,
    SafetyEvent,
    TokenBudget,
    TokenTotals,
    WrapOptions,
)
from .runtime.coordinator import Coordinator
from .shield.breaker import BreakerState, CircuitBreaker
from .shield.egress import DenyListEgressHook
from .shield.pipeline import ShieldPipeline, ToolCallContext
from .shield.policy import PolicyContext, PolicyDecision
from .shield.windows import BudgetWindowHook

__all__ = [
    "ActiveLimits",
    "BreakerState",
    "BudgetWarning",
    "BudgetWindowHook",
    "CallInfo",
    "CancellationToken",
    "CancelledByContext",
    "ChainMetadata",
    "CircuitBreaker",
    "ContextData",
    "ContextSnapshot",
    "Coordinator",
    "DeadlineExceededError",
    "Decision",
    "Degrade",
    "DenyListEgressHook",
    "ExecutionConfig",
    "LeasePolicy",
    "ExecutionContext",
    "ExposurePolicy",
    "IsolationLevel",
    "LedgerReservation",
    "MergePolicy",
    "MergeResult",
    "NodeRecord",
    "PolicyContext",
    "PolicyDecision",
    "PromptEvaluationError",
    "SafetyEvent",
    "ShieldPipeline",
    "TokenBudget",
    "TokenBudgetExceededError",
    "TokenLedger",
    "TokenTotals",
    "ToolCallContext",
    "WrapOptions",
    "ametered_stream",
    "current_call",
    "current_cancellation_token",
    "current_context",
    "current_data_view",
    "current_limits",
    "merge_children",
    "metered_stream",
    "model_price",
    "report_usage",
    "run_parallel",
    "set_price",
]
